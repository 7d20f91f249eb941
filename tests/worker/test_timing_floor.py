"""The timing floor (worker.numerics.floor): the device's own peak bandwidth, the bytes an op must touch, and a
breach making the benchmark stage inconclusive (`error`), not `fail`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.numerics.floor import (
    KNOWN_PEAKS,
    bytes_touched,
    device_peak_bandwidth,
    peak_bandwidth,
    timing_floor,
)
from worker.numerics.timing_settings import BANDWIDTH_ENV, TimingSettings
from worker.stages.benchmark import FLOOR_PHRASE
from worker.stages.result import StageStatus, Verdict

CATALOGUE = load_catalogue()


@dataclass
class _Props:
    """The two fields of torch.cuda.get_device_properties the floor reads, where a torch build exposes them."""

    memory_clock_rate: int  # kHz
    memory_bus_width: int  # bits


def test_an_honest_kernel_between_the_h200_and_b200_floors_is_not_flagged_on_a_b200() -> None:
    moved = 6 * 1024**3  # 6 GiB read and written
    h200 = timing_floor(moved, peak_bandwidth("NVIDIA H200", None, gpu=True))
    b200 = timing_floor(moved, peak_bandwidth("NVIDIA B200", None, gpu=True))
    assert h200 is not None and b200 is not None
    assert h200.bandwidth.bytes_per_s == 4.8e12 and b200.bandwidth.bytes_per_s == 8.0e12
    honest_ms = (h200.floor_ms + b200.floor_ms) / 2  # a B200 kernel at 80% of its peak
    assert not b200.breached_by(honest_ms)
    # the old hard-coded H200 figure would have called the same time impossible
    assert h200.breached_by(honest_ms)
    assert b200.breached_by(b200.floor_ms * 0.99)


def test_the_peak_comes_from_the_setting_then_the_device_then_its_name() -> None:
    h100 = _Props(memory_clock_rate=2_619_000, memory_bus_width=5120)  # what CUDA reports for an H100 SXM
    from_props = peak_bandwidth("NVIDIA H100 80GB HBM3", h100, gpu=True)
    assert from_props is not None and from_props.source == "device_properties"
    assert from_props.bytes_per_s == pytest.approx(3.35e12, rel=0.01)
    named = peak_bandwidth("NVIDIA GB200", object(), gpu=True)  # a torch that exposes neither field
    assert named is not None and named.source == "name_table" and named.bytes_per_s == KNOWN_PEAKS["GB200"]
    unknown = peak_bandwidth("NVIDIA Z9000", None, gpu=True)
    assert (
        unknown is not None and unknown.source == "fastest_known" and unknown.bytes_per_s == max(KNOWN_PEAKS.values())
    )
    set_ = peak_bandwidth("NVIDIA H200", h100, gpu=True, setting=1e13)
    assert set_ is not None and set_.source == "setting" and set_.bytes_per_s == 1e13
    assert peak_bandwidth(None, None, gpu=False) is None  # the CPU: no floor unless the setting names one
    assert device_peak_bandwidth("cpu", TimingSettings.from_env({}).peak_bandwidth_bytes_per_s) is None
    cpu = device_peak_bandwidth("cpu", TimingSettings.from_env({BANDWIDTH_ENV: "2e11"}).peak_bandwidth_bytes_per_s)
    assert cpu is not None and cpu.bytes_per_s == 2e11
    with pytest.raises(ValueError, match=BANDWIDTH_ENV):
        TimingSettings.from_env({BANDWIDTH_ENV: "-5"})


def test_a_lookup_table_counts_only_the_rows_its_ids_select() -> None:
    """embedding_rmsnorm_backward reads `weight` (vocab x hidden) only at the rows `indices` names; the output
    grad_weight is written whole; grad_output, gamma and the ids are read whole."""
    definition = CATALOGUE.get("embedding_rmsnorm_backward").definition
    vocab, hidden, tokens = 50_000, 64, 4096
    indices = torch.randint(0, 100, (tokens,), generator=torch.Generator().manual_seed(0))
    indices[:5] = -1  # padding sentinels select nothing
    args = [
        indices,
        torch.zeros(vocab, hidden, dtype=torch.bfloat16),
        torch.ones(hidden, dtype=torch.bfloat16),
        torch.zeros(tokens, hidden, dtype=torch.bfloat16),
        1e-6,
    ]
    outs = [{"shape": [vocab, hidden], "dtype": "bfloat16"}, {"shape": [hidden], "dtype": "bfloat16"}]
    t = bytes_touched(definition, args, outs)
    distinct = int(torch.unique(indices[indices >= 0]).numel())
    row = hidden * 2
    assert t.tables["weight"].index == "indices" and t.tables["weight"].rows_read == distinct <= 100
    assert t.inputs["weight"] == distinct * row  # not vocab * row: 99.8% of the table is never read
    assert t.outputs == vocab * row + hidden * 2
    assert t.total == t.outputs + tokens * 8 + hidden * 2 + tokens * row + distinct * row


def test_inputs_that_run_along_another_input_are_counted_whole() -> None:
    """cross_entropy's logits share their leading axis with the targets: every row is read, whatever the ids."""
    definition = CATALOGUE.get("cross_entropy").definition
    tokens, vocab = 64, 1000
    targets = torch.zeros(tokens, dtype=torch.int64)  # one distinct id: a table rule would count one row
    args = [torch.zeros(tokens, vocab, dtype=torch.bfloat16), targets, -100]
    outs = [{"shape": [], "dtype": "float32"}, {"shape": [tokens, vocab], "dtype": "bfloat16"}]
    t = bytes_touched(definition, args, outs)
    assert t.tables == {} and t.inputs["logits"] == tokens * vocab * 2
    assert t.total == 4 + 2 * tokens * vocab * 2 + tokens * 8


def test_a_time_below_the_floor_makes_the_benchmark_inconclusive_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bandwidth of one byte a second puts the floor at hours: the correct kernel's real time breaches it."""
    monkeypatch.setenv(BANDWIDTH_ENV, "1")
    emb = CATALOGUE.get("embedding_backward")
    report = run_audit(emb, emb.example_solution("pytorch_fp32"), stages=["intake", "benchmark"], seed=11)
    bench = {s.name: s for s in report.stages}["benchmark"]
    assert bench.status is StageStatus.error and report.verdict is Verdict.error
    assert FLOOR_PHRASE in bench.summary and "(setting)" in bench.summary
    floor = bench.metrics["timing"]["floor"]
    assert floor["bandwidth_bytes_per_s"] == 1.0 and floor["bandwidth_source"] == "setting"
    assert bench.metrics["timing"]["bandwidth_floor_ms"] == pytest.approx(floor["bytes"] * 1e3)
