"""Bring your own distribution: the user's token statistics replace the built-in text in the id probes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from worker.catalogue import load_catalogue
from worker.probes.distributions import ProbeSources, build_probe_case
from worker.probes.token_stats import TokenStats, TokenStatsError
from worker.problem_spec import ProbeSpec

EMB = load_catalogue().get("embedding_backward")


def _probe() -> ProbeSpec:
    return ProbeSpec.model_validate(
        {
            "name": "real_text",
            "why": "test",
            "axes": {"num_tokens": 2048, "vocab_size": 1000, "hidden_size": 8},
            "inputs": {
                "indices": {"kind": "real_text_ids", "high_axis": "vocab_size"},
                "num_embeddings": {"kind": "from_axis", "axis": "vocab_size"},
                "padding_idx": {"kind": "scalar", "value": -1},
            },
        }
    )


def _ids(stats: TokenStats | None, seed: int = 4) -> tuple[torch.Tensor, list[str]]:
    notes: list[str] = []
    sources = ProbeSources(token_stats=stats.load() if stats else None)
    case = build_probe_case(EMB.definition, _probe(), "cpu", seed, sources, notes)
    return case.inputs["indices"], notes


def test_histogram_changes_the_drawn_ids(tmp_path: Path) -> None:
    hist = np.zeros(50_000, dtype=np.float32)
    hist[[3, 7, 1234]] = [0.6, 0.3, 0.1]  # 1234 is past the probe's 1000 ids: folded to 234
    np.save(tmp_path / "hist.npy", hist)
    builtin, _ = _ids(None)
    mine, notes = _ids(TokenStats(path=tmp_path / "hist.npy"))
    assert set(mine.unique().tolist()) == {3, 7, 234}
    assert len(set(builtin.unique().tolist())) > 50  # the English corpus spreads over many ids
    counts = torch.bincount(mine, minlength=1000)
    assert counts[3] > counts[7] > counts[234] > 0
    assert any("user's token statistics (histogram" in n and "folded into range" in n for n in notes)


def test_sample_of_ids_is_read_as_a_window(tmp_path: Path) -> None:
    sample = torch.arange(10_000, dtype=torch.int32) % 97  # a periodic "text": a window keeps the period
    save_file({"ids": sample}, str(tmp_path / "ids.safetensors"))
    ids, _ = _ids(TokenStats(path=tmp_path / "ids.safetensors"))
    assert torch.equal((ids[1:] - ids[:-1]) % 97, torch.ones(ids.numel() - 1, dtype=ids.dtype))
    # the same file read as a histogram of 10,000 bins draws i.i.d. instead
    hist, _ = _ids(TokenStats(path=tmp_path / "ids.safetensors", kind="histogram"))
    assert not torch.equal((hist[1:] - hist[:-1]) % 97, torch.ones(hist.numel() - 1, dtype=hist.dtype))


def test_bad_token_stats_are_refused_clearly(tmp_path: Path) -> None:
    np.save(tmp_path / "neg.npy", np.array([1, -2, 3]))
    np.save(tmp_path / "twod.npy", np.ones((2, 2)))
    (tmp_path / "ids.txt").write_text("1 2 3")
    save_file({"a": torch.ones(3), "b": torch.ones(3)}, str(tmp_path / "two.safetensors"))
    for path, message in (
        ("neg.npy", "must be >= 0"),
        ("twod.npy", "1-D"),
        ("ids.txt", ".npy or .safetensors"),
        ("two.safetensors", "name the tensor"),
        ("missing.npy", "no such file"),
    ):
        with pytest.raises(TokenStatsError, match=message):
            TokenStats(path=tmp_path / path).load()


def test_cli_flag_rejects_an_unreadable_file_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "ids.txt").write_text("1 2 3")
    solution = Path(__file__).resolve().parents[2] / "kernels/embedding_backward/solutions/pytorch_fp32"
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "audit", str(solution), "--token-stats", str(tmp_path / "ids.txt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--token-stats" in r.stderr and ".npy or .safetensors" in r.stderr
