"""The text cache built before any audit (worker.text.warm, `kaudit warm-cache`) covers what the audits draw."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from app.cli import app
from worker.catalogue import Catalogue, Profile, load_catalogue
from worker.generic.shapes import jitter_bounds, jittered_keeping_divisibility
from worker.text import tokenizer
from worker.text.tokenizer import text_vocab
from worker.text.warm import REAL_TEXT, vocab_sizes, warm_text_cache


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


@pytest.fixture
def fresh_text_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty KAUDIT_CACHE_DIR, as a fresh process sees it (no tokenizer or ids held in memory)."""
    monkeypatch.setenv("KAUDIT_CACHE_DIR", str(tmp_path))
    tokenizer.get_tokenizer.cache_clear()
    tokenizer._ids_array.cache_clear()
    yield tmp_path
    tokenizer.get_tokenizer.cache_clear()
    tokenizer._ids_array.cache_clear()


@pytest.mark.parametrize("v", [7, 8, 1000, 1023, 2048, 32000, 50257, 128256])
def test_jitter_bounds_hold_every_draw_and_span_the_stated_size(catalogue: Catalogue, v: int) -> None:
    definition = catalogue.get("cross_entropy").definition
    lo, hi = jitter_bounds(v)
    drawn = {
        jittered_keeping_divisibility(
            definition, {"num_tokens": 4, "vocab_size": v}, torch.Generator().manual_seed(s)
        ).get("vocab_size", v)
        for s in range(300)
    }
    assert lo <= min(drawn) and max(drawn) <= hi, (v, lo, hi, sorted(drawn)[:3], sorted(drawn)[-3:])
    if v >= 1000:  # (a small power of two, 8, has no other size of its own divisibility within 25%)
        assert lo < v < hi and lo >= 0.75 * v and hi <= 1.25 * v


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_warm_sizes_cover_every_real_text_draw_of_the_catalogue(catalogue: Catalogue, profile: Profile) -> None:
    sizes = set(vocab_sizes(catalogue, profile))
    seen = 0
    for problem in catalogue:
        for probe in problem.spec.probes:
            axes = probe.axes_for(profile)
            for gen in probe.inputs.values():
                if gen.kind != REAL_TEXT and gen.params.get("base") != REAL_TEXT:
                    continue
                axis = gen.params["high_axis"]
                for s in range(100):
                    drawn = {
                        **axes,
                        **jittered_keeping_divisibility(problem.definition, axes, torch.Generator().manual_seed(s)),
                    }
                    want = text_vocab(drawn[axis])
                    assert want in sizes, (problem.name, probe.name, drawn[axis], want, sorted(sizes))
                    seen += 1
    assert seen >= 300  # cross-entropy's three real-text probes at least


def test_cross_entropy_gpu_probes_need_three_sizes_and_the_canary_its_own(catalogue: Catalogue) -> None:
    # vocab_size 32000 drawn in [24000, 40000]: below 24576 the 16384 ladder, then 24576 and 32768
    assert vocab_sizes(catalogue, "gpu") == [16384, 24576, 32768]
    assert 2048 in vocab_sizes(catalogue, "cpu")  # the CPU canary's vocabulary


def _built(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("ids-*.npy"))


def test_warm_builds_each_size_once_then_audits_read_it(
    fresh_text_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    took = warm_text_cache([512, 768])
    assert sorted(took) == [512, 768]
    assert _built(fresh_text_cache) == [512, 768]
    tokenizer._ids_array.cache_clear()  # a fresh process: the ids come from disk, no tokenizer is trained
    tokenizer.get_tokenizer.cache_clear()
    monkeypatch.setattr(tokenizer, "_train", lambda v: pytest.fail(f"trained a tokenizer at {v} after warm-up"))
    assert tokenizer.text_token_ids(700).max() < 512


def test_text_vocab_names_the_only_size_text_token_ids_builds(fresh_text_cache: Path) -> None:
    for high in (100, 700):  # below the byte alphabet (folded 256-id stream), and a ladder size (512)
        tokenizer.text_token_ids(high)
    assert _built(fresh_text_cache) == sorted({text_vocab(100), text_vocab(700)}) == [256, 512]


def test_cli_refuses_an_unknown_profile() -> None:
    r = CliRunner().invoke(app, ["warm-cache", "--profile", "tpu"])
    assert r.exit_code == 2 and "--profile must be cpu or gpu, not tpu" in r.stderr
