"""Probe input generators (worker.probes.distributions): shapes, ranges, and the statistics that matter."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from worker.catalogue import load_catalogue
from worker.formats import Definition
from worker.probes.distributions import (
    GenContext,
    ProbeInputError,
    build_probe_case,
    generate_input,
    permute_case,
)
from worker.problem_spec import InputGenerator, ProbeSpec
from worker.text import corpus_token_ids, ladder_vocab

AXES = {"num_tokens": 4096, "vocab_size": 2048, "hidden_size": 64}


@pytest.fixture(scope="module")
def definition() -> Definition:
    return load_catalogue().get("embedding_backward").definition


def probe(
    ids: dict[str, Any],
    grad: dict[str, Any] | None = None,
    *,
    axes: dict[str, int] | None = None,
    pad: int = -1,
    pad_first: bool = False,
) -> ProbeSpec:
    inputs: dict[str, Any] = {"padding_idx": {"kind": "scalar", "value": pad}} if pad_first else {}
    inputs["indices"] = ids
    if grad is not None:
        inputs["grad_output"] = grad
    inputs["num_embeddings"] = {"kind": "from_axis", "axis": "vocab_size"}
    if not pad_first:
        inputs["padding_idx"] = {"kind": "scalar", "value": pad}
    return ProbeSpec.model_validate({"name": "t", "why": "test", "axes": axes or AXES, "inputs": inputs})


def counts(ids: torch.Tensor) -> torch.Tensor:
    return torch.bincount(ids.reshape(-1), minlength=AXES["vocab_size"])


def test_uniform_ids_shape_dtype_range_and_multiplicity(definition: Definition) -> None:
    case = build_probe_case(definition, probe({"kind": "uniform_ids", "high_axis": "vocab_size"}), "cpu", 1)
    ids = case.inputs["indices"]
    assert ids.shape == (4096,) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < 2048
    assert int(counts(ids).max()) < 20  # about two per row: what the benchmark tests
    assert case.inputs["num_embeddings"] == 2048 and case.inputs["padding_idx"] == -1
    assert case.output_shapes == {"grad_weight": (2048, 64)}


def test_unlisted_float_input_is_standard_normal(definition: Definition) -> None:
    case = build_probe_case(definition, probe({"kind": "uniform_ids", "high_axis": "vocab_size"}), "cpu", 1)
    g = case.inputs["grad_output"]
    assert g.dtype == torch.bfloat16 and g.shape == (4096, 64)
    assert 0.95 < float(g.float().std()) < 1.05 and abs(float(g.float().mean())) < 0.02


def test_same_seed_same_inputs_other_seed_other_inputs(definition: Definition) -> None:
    p = probe({"kind": "zipf_ids", "s": 1.0, "high_axis": "vocab_size"}, {"kind": "normal", "std": 1e-3})
    a, b, c = (build_probe_case(definition, p, "cpu", s) for s in (7, 7, 8))
    assert torch.equal(a.inputs["indices"], b.inputs["indices"])
    assert torch.equal(a.inputs["grad_output"], b.inputs["grad_output"])
    assert not torch.equal(a.inputs["indices"], c.inputs["indices"])


def test_zipf_puts_hundreds_of_contributions_on_the_hottest_row(definition: Definition) -> None:
    hottest = {}
    for s in (1.0, 1.2):
        case = build_probe_case(definition, probe({"kind": "zipf_ids", "s": s, "high_axis": "vocab_size"}), "cpu", 3)
        ids = case.inputs["indices"]
        assert int(ids.min()) >= 0 and int(ids.max()) < 2048
        hottest[s] = int(counts(ids).max())
    # Zipf(1.0) over 2048 ids: p(rank 1) = 1/H_2048 ~ 0.12 -> ~500 of 4096; s = 1.2 is steeper
    assert 350 < hottest[1.0] < 650
    assert hottest[1.2] > hottest[1.0] * 1.4
    # ranks are permuted onto ids: the hottest id is not always id 0
    ids = [
        int(
            counts(
                build_probe_case(
                    definition, probe({"kind": "zipf_ids", "s": 1.2, "high_axis": "vocab_size"}), "cpu", s
                ).inputs["indices"]
            ).argmax()
        )
        for s in range(4)
    ]
    assert len(set(ids)) > 1


def test_real_text_ids_are_a_window_of_the_corpus_stream(definition: Definition) -> None:
    p = probe({"kind": "real_text_ids", "high_axis": "vocab_size"}, axes={**AXES, "num_tokens": 8192})
    ids = build_probe_case(definition, p, "cpu", 5).inputs["indices"]
    stream = corpus_token_ids(2048)
    assert ids.shape == (8192,) and int(ids.max()) < 2048
    # find the window: every position where the first 16 ids match, then compare all
    first = (stream[: stream.numel() - 8192] == ids[0]).nonzero().flatten()
    assert any(torch.equal(stream[int(o) : int(o) + 8192], ids) for o in first[:5000])
    assert int(counts(ids).max()) > 300  # frequent tokens: hundreds of contributions on one row


def test_real_text_at_a_drawn_vocabulary_uses_the_ladder_tokenizer_below_it(definition: Definition) -> None:
    # a vocabulary drawn per audit (2,112 here) reuses the 2,048-id tokenizer instead of training one for 2,112
    assert [ladder_vocab(v) for v in (100, 256, 2047, 2048, 2112, 3071, 3072, 50257)] == [
        100,
        256,
        1536,
        2048,
        2048,
        2048,
        3072,
        49152,
    ]
    p = probe(
        {"kind": "real_text_ids", "high_axis": "vocab_size"}, axes={**AXES, "vocab_size": 2112, "num_tokens": 4096}
    )
    ids = build_probe_case(definition, p, "cpu", 5).inputs["indices"]
    stream = corpus_token_ids(2048)
    first = (stream[: stream.numel() - 4096] == ids[0]).nonzero().flatten()
    assert int(ids.max()) < 2048 and any(torch.equal(stream[int(o) : int(o) + 4096], ids) for o in first[:5000])


@pytest.mark.parametrize("high", [192, 40, 1])
def test_real_text_below_a_byte_alphabet_folds_ranks_and_keeps_the_heavy_head(
    definition: Definition, high: int
) -> None:
    # segment or class counts can be below the 256 ids of a byte-level BPE's alphabet: ids must still be in range
    p = probe(
        {"kind": "real_text_ids", "high_axis": "vocab_size"}, axes={**AXES, "vocab_size": high, "num_tokens": 8192}
    )
    ids = build_probe_case(definition, p, "cpu", 5).inputs["indices"]
    assert ids.shape == (8192,) and int(ids.min()) >= 0 and int(ids.max()) < high
    byte_stream = corpus_token_ids(256)
    top = int(torch.bincount(byte_stream).max()) / byte_stream.numel()
    assert int(counts(ids).max()) / ids.numel() >= 0.8 * top  # the most frequent token is at least as hot as in text


def test_hot_id_takes_the_fraction(definition: Definition) -> None:
    ids = build_probe_case(
        definition, probe({"kind": "hot_id", "fraction": 0.5, "high_axis": "vocab_size"}), "cpu", 2
    ).inputs["indices"]
    c = counts(ids)
    assert 2048 <= int(c.max()) <= 2048 + 10


def test_padding_heavy_uses_the_earlier_scalar(definition: Definition) -> None:
    p = probe(
        {
            "kind": "padding_heavy",
            "fraction": 0.3,
            "pad_from": "padding_idx",
            "base": "zipf_ids",
            "high_axis": "vocab_size",
        },
        pad=5,
        pad_first=True,
    )
    case = build_probe_case(definition, p, "cpu", 4)
    ids = case.inputs["indices"]
    assert case.inputs["padding_idx"] == 5
    assert int((ids == 5).sum()) >= round(0.3 * 4096)
    assert list(case.inputs) == list(definition.inputs)  # definition order, whatever the probe's order


def test_padding_heavy_needs_the_pad_scalar_listed_first(definition: Definition) -> None:
    p = probe({"kind": "padding_heavy", "fraction": 0.3, "pad_from": "padding_idx", "high_axis": "vocab_size"}, pad=5)
    with pytest.raises(ProbeInputError, match="must be listed before"):
        build_probe_case(definition, p, "cpu", 4)


def test_normal_scales_and_positive_sign(definition: Definition) -> None:
    for std in (1e-4, 1e3):
        g = (
            build_probe_case(
                definition,
                probe({"kind": "uniform_ids", "high_axis": "vocab_size"}, {"kind": "normal", "std": std}),
                "cpu",
                1,
            )
            .inputs["grad_output"]
            .double()
        )
        assert 0.95 * std < float(g.std()) < 1.05 * std
    g = (
        build_probe_case(
            definition,
            probe({"kind": "uniform_ids", "high_axis": "vocab_size"}, {"kind": "positive", "scale": 1e-3}),
            "cpu",
            1,
        )
        .inputs["grad_output"]
        .double()
    )
    assert float(g.min()) >= 0 and 0.5e-3 < float(g.mean()) < 1.0e-3  # |N(0,1)| has mean 0.8


def test_shared_direction_rows_of_one_id_point_one_way(definition: Definition) -> None:
    p = probe(
        {"kind": "zipf_ids", "s": 1.0, "high_axis": "vocab_size"},
        {"kind": "shared_direction", "ids_from": "indices", "std": 1e-3, "noise": 0.1},
    )
    case = build_probe_case(definition, p, "cpu", 6)
    ids, g = case.inputs["indices"], case.inputs["grad_output"].double()
    hot = int(counts(ids).argmax())
    rows = torch.nn.functional.normalize(g[ids == hot], dim=1)
    assert float((rows @ rows.T).min()) > 0.9
    other = torch.nn.functional.normalize(g[ids != hot][:50], dim=1)
    assert float((rows[:50] @ other.T).abs().mean()) < 0.3
    assert 1e-4 < float(g.abs().mean()) < 1e-2


def test_int_inputs_and_scalars_must_be_listed(definition: Definition) -> None:
    p = ProbeSpec.model_validate({"name": "t", "why": "x", "axes": AXES, "inputs": {"grad_output": {"kind": "normal"}}})
    with pytest.raises(ProbeInputError, match="indices"):
        build_probe_case(definition, p, "cpu", 1)


def test_bad_kind_params_and_dtype_are_reported(definition: Definition) -> None:
    with pytest.raises(ProbeInputError, match="unknown generator kind"):
        build_probe_case(definition, probe({"kind": "bogus"}), "cpu", 1)
    with pytest.raises(ProbeInputError, match="bad parameters"):
        build_probe_case(definition, probe({"kind": "zipf_ids", "s": -1, "high_axis": "vocab_size"}), "cpu", 1)
    with pytest.raises(ProbeInputError, match="unknown axis"):
        build_probe_case(definition, probe({"kind": "uniform_ids", "high_axis": "nope"}), "cpu", 1)
    with pytest.raises(ProbeInputError, match="floating"):
        build_probe_case(definition, probe({"kind": "normal"}), "cpu", 1)


def test_gpu_profile_uses_gpu_axes(definition: Definition) -> None:
    p = ProbeSpec.model_validate(
        {
            "name": "t",
            "why": "x",
            "axes": AXES,
            "gpu_axes": {"num_tokens": 100, "vocab_size": 300, "hidden_size": 8},
            "inputs": {
                "indices": {"kind": "uniform_ids", "high_axis": "vocab_size"},
                "num_embeddings": {"kind": "from_axis", "axis": "vocab_size"},
                "padding_idx": {"kind": "scalar", "value": -1},
            },
        }
    )
    assert build_probe_case(definition, p, "gpu", 1).inputs["grad_output"].shape == (100, 8)
    assert build_probe_case(definition, p, "cpu", 1).inputs["grad_output"].shape == (4096, 64)


def test_permute_case_permutes_every_input_on_the_axis(definition: Definition) -> None:
    case = build_probe_case(definition, probe({"kind": "zipf_ids", "s": 1.0, "high_axis": "vocab_size"}), "cpu", 1)
    perm = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    p = permute_case(definition, case, "num_tokens", perm)
    assert torch.equal(p.inputs["indices"], case.inputs["indices"][perm])
    assert torch.equal(p.inputs["grad_output"], case.inputs["grad_output"][perm])
    assert p.inputs["num_embeddings"] == case.inputs["num_embeddings"]


@dataclasses.dataclass(frozen=True)
class _HostArithmetic(GenContext):
    """The same draws from the same GPU generator, with every generator's arithmetic on the CPU (as before
    the arithmetic moved to the draws' device)."""

    def randn(self, *shape: int) -> torch.Tensor:
        return super().randn(*shape).cpu()

    def here(self, t: torch.Tensor) -> torch.Tensor:
        return t


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("normal", {"std": 1e-3, "mean": 0.5}),
        ("positive", {"scale": 30.0}),
        ("zero_rows", {"fraction": 0.25, "std": 3.0}),
        ("offset_rows", {"min_ratio": 10.0, "max_ratio": 1000.0, "std": 0.1}),
        ("shared_direction", {"ids_from": "ids", "std": 1e-2, "noise": 0.1}),
    ],
)
def test_gpu_draws_give_the_inputs_the_cpu_arithmetic_gives(
    kind: str, params: dict[str, Any], dtype: torch.dtype
) -> None:
    """Float inputs drawn on the GPU and computed there are bit for bit the ones the same draws computed on the CPU give."""
    shape, seed = (4099, 257), 11
    ids = torch.randint(0, 97, (4099,), generator=torch.Generator().manual_seed(3))

    def make(cls: type[GenContext]) -> torch.Tensor:
        ctx = cls(
            "p",
            "x",
            shape,
            dtype,
            {},
            {"ids": ids},
            torch.Generator().manual_seed(seed),
            None,
            None,
            torch.Generator(device="cuda").manual_seed(seed),
        )
        return generate_input(ctx, InputGenerator(kind=kind, **params))

    on_gpu, on_host = make(GenContext), make(_HostArithmetic)
    assert on_gpu.device.type == "cpu" and on_gpu.dtype == dtype and tuple(on_gpu.shape) == shape
    assert torch.equal(
        on_gpu.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        on_host.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
    )
