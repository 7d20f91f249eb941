"""Token statistics read from bytes (what the API validates at POST and the worker loads), the same reader as
from a path (the CLI), and hostile bytes refused with the field at fault and without allocating what they claim."""

from __future__ import annotations

import io
import re
import resource
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save as save_safetensors

from worker.probes.token_stats import LoadedTokenStats, TokenStats, TokenStatsError
from worker.probes.token_stats_read import MAX_HISTOGRAM_BINS, format_of, parse


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_bytes_and_path_give_the_same_statistics(tmp_path: Path) -> None:
    ids = (np.arange(3000) * 7919 % 5000).astype(np.int32)
    hist = np.random.default_rng(0).random(700).astype(np.float32)
    for name, array, kind in (("ids.npy", ids, "sample"), ("hist.npy", hist, "histogram")):
        (tmp_path / name).write_bytes(_npy(array))
        from_path = TokenStats(path=tmp_path / name).load()
        from_bytes = LoadedTokenStats.from_bytes(_npy(array), "npy", source="upload")
        assert from_path.kind == from_bytes.kind == kind
        assert torch.equal(from_path.values, from_bytes.values)
        assert from_bytes.values.dtype == (torch.int64 if kind == "sample" else torch.float64)
        assert from_bytes.source == "upload" and from_path.source == str(tmp_path / name)


def test_safetensors_from_bytes_picks_the_tensor_and_reads_bf16() -> None:
    one = save_safetensors({"ids": torch.arange(10, dtype=torch.int16)})
    parsed = parse(one, "safetensors")
    assert parsed.kind == "sample" and parsed.key == "ids" and parsed.values.tolist() == list(range(10))
    two = save_safetensors({"counts": torch.tensor([0, 5, 1], dtype=torch.int64), "other": torch.ones(2)})
    counts = parse(two, "safetensors", key="counts")  # an integer tensor keyed 'counts' is a histogram under auto
    assert counts.kind == "histogram" and counts.values.tolist() == [0.0, 5.0, 1.0]
    bf16 = save_safetensors({"h": torch.tensor([0.5, 0.0, 2.0, 1e-3], dtype=torch.bfloat16)})
    loaded = LoadedTokenStats.from_bytes(bf16, "safetensors", source="s")
    assert loaded.kind == "histogram"
    assert torch.equal(loaded.values, torch.tensor([0.5, 0.0, 2.0, 1e-3], dtype=torch.bfloat16).double())


@pytest.mark.parametrize(
    ("data", "fmt", "kind", "key", "field", "message"),
    [
        (_npy(np.array([1, -2, 3])), "npy", "auto", None, "data", "must be >= 0"),
        (_npy(np.ones((2, 2))), "npy", "auto", None, "data", "non-empty 1-D"),
        (_npy(np.array([], dtype=np.int64)), "npy", "auto", None, "data", "non-empty 1-D"),
        (_npy(np.array([True, False])), "npy", "auto", None, "data", "neither integer nor floating"),
        (_npy(np.array(["a", "b"])), "npy", "auto", None, "data", "neither integer nor floating"),
        (_npy(np.array([0.5, 1.5])), "npy", "sample", None, "kind", "must be an integer array"),
        (_npy(np.array([1.0, np.nan])), "npy", "auto", None, "data", "finite, non-negative counts"),
        (_npy(np.array([0.0, 0.0])), "npy", "histogram", None, "data", "positive sum"),
        (_npy(np.array([1, 2])), "npy", "auto", "ids", "key", "a .npy file holds one array"),
        (_npy(np.array([1, 2])), "npy", "zipf", None, "kind", "kind must be one of"),
        (_npy(np.array([1, 2]))[:-3], "npy", "auto", None, "data", "but 13 bytes follow it"),
        (_npy(np.array([1, 2])) + b"xx", "npy", "auto", None, "data", "but 18 bytes follow it"),
        (b"1 2 3\n", "npy", "auto", None, "data", "not a readable .npy array"),
        (b"\x00" * 40, "safetensors", "auto", None, "data", "not a readable safetensors file"),
        (
            save_safetensors({"a": torch.ones(3), "b": torch.ones(3)}),
            "safetensors",
            "auto",
            None,
            "key",
            "name the tensor",
        ),
        (save_safetensors({"a": torch.ones(3)}), "safetensors", "auto", "nope", "key", "no tensor 'nope'"),
        (
            save_safetensors({"a": torch.ones(3, dtype=torch.bool)}),
            "safetensors",
            "auto",
            None,
            "data",
            "neither integer nor floating",
        ),
        (
            save_safetensors({"a": torch.tensor([2**63 + 5], dtype=torch.uint64)}),
            "safetensors",
            "auto",
            None,
            "data",
            "below 2**63",
        ),
    ],
)
def test_bad_bytes_name_the_field_and_what_to_change(
    data: bytes, fmt: str, kind: str, key: str | None, field: str, message: str
) -> None:
    with pytest.raises(TokenStatsError, match=re.escape(message)) as err:
        parse(data, fmt, kind, key)  # type: ignore[arg-type]
    assert err.value.field == field
    with pytest.raises(
        TokenStatsError, match=re.escape(message)
    ):  # the worker's loader: the same reader, the same refusal
        LoadedTokenStats.from_bytes(data, fmt, kind, key, source="upload")  # type: ignore[arg-type]


def test_a_header_claiming_a_huge_array_is_refused_before_allocating_it() -> None:
    """A 128-byte .npy whose header announces 2**40 int64 values (8 TiB): refused at once, nothing allocated."""
    header = b"{'descr': '<i8', 'fortran_order': False, 'shape': (1099511627776,), }"
    header += b" " * (117 - len(header)) + b"\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x00" * 16
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TokenStatsError, match=r"announces 1099511627776 values .* but 16 bytes follow it"):
        parse(data, "npy")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: no big allocation happened


def test_histograms_beyond_what_multinomial_draws_from_are_refused() -> None:
    with pytest.raises(TokenStatsError, match="at most 16777216 bins"):
        parse(_npy(np.ones(MAX_HISTOGRAM_BINS + 1, dtype=np.uint8)), "npy", "histogram")


def test_format_comes_from_the_file_name() -> None:
    assert format_of("a/b/IDS.NPY") == "npy" and format_of("x.safetensors") == "safetensors"
    with pytest.raises(TokenStatsError, match=r"\.npy or \.safetensors"):
        format_of("ids.txt")


def test_the_reader_does_not_import_torch() -> None:
    """The API validates uploads with it and must not load torch (README: the API process never imports torch)."""
    import subprocess
    import sys

    code = (
        "import sys, io, numpy as np; from worker.probes.token_stats_read import parse; b = io.BytesIO(); "
        "np.save(b, np.arange(5)); assert parse(b.getvalue(), 'npy').kind == 'sample'; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
