"""The parent's canary runs read back from disk give the judgement a fresh training gives, and nothing else.

Real parts throughout: the catalogue's embedding-backward problem, its kernels in their sandbox children, the
canary stage's own training; only the profile is shortened (20 steps) to keep the test quick."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.canary import parent_cache
from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.stages import canary as canary_stage
from worker.stages.result import StageResult, StageStatus

PROFILE = profile_for("cpu", steps=20, checkpoints=(10, 20), fidelity_steps=(0, 20), seed_pool=2)
PROBLEM = load_catalogue().get("embedding_backward")
JUDGED = ("loss_gap", "loss_threshold", "noise_band", "fidelity_worst_ratio", "fidelity_failed")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KAUDIT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _canary(solution: str, seed: int) -> StageResult:
    ctx = AuditContext(problem=PROBLEM, solution=PROBLEM.example_solution(solution), device="cpu", seed=seed)
    try:
        return canary_stage.run(ctx, PROFILE)
    finally:
        ctx.close()


def _seed_with_pooled(target: int) -> int:
    """An audit seed whose canary seed is `target`'s (audit seeds pick a pooled seed through a hash)."""
    want = None
    for s in range(1000):
        ctx = AuditContext(problem=PROBLEM, solution=PROBLEM.example_solution("pytorch_fp32"), device="cpu", seed=s)
        pooled = parent_cache.pooled_seed(ctx.derive_seed("canary"), PROFILE.seed_pool or 1)
        if s == target:
            want = pooled
        elif want is not None and pooled == want:
            return s
    raise AssertionError("no other audit seed shares the pooled canary seed")


def test_a_repeated_canary_seed_reads_the_parent_runs_and_judges_the_same(cache: Path) -> None:
    first = _canary("pytorch_fp32", seed=1)
    assert "parent_read_from_cache" not in first.metrics["timings"]
    assert len(list((cache / "canary-parent").glob("*.pt"))) == 1
    again = _canary("pytorch_fp32", seed=_seed_with_pooled(1))
    assert again.metrics["timings"].get("parent_read_from_cache") == 1.0
    assert again.evidence["seed"] == first.evidence["seed"]
    assert {k: again.metrics[k] for k in JUDGED} == {k: first.metrics[k] for k in JUDGED}
    assert again.status is first.status is StageStatus.passed
    # alone on a hit, the submission's process gets the parent's core too
    assert (first.metrics["timings"]["submission_threads"], again.metrics["timings"]["submission_threads"]) == (1, 2)


def test_a_bad_kernel_judged_against_cached_runs_still_fails(cache: Path) -> None:
    _canary("pytorch_fp32", seed=1)
    bad = _canary("pytorch_bf16_accum", seed=_seed_with_pooled(1))
    assert bad.metrics["timings"].get("parent_read_from_cache") == 1.0
    assert bad.status is StageStatus.failed and bad.metrics["fidelity_failed"], bad.summary


def test_an_unreadable_entry_is_trained_again(cache: Path) -> None:
    first = _canary("pytorch_fp32", seed=1)
    (entry,) = (cache / "canary-parent").glob("*.pt")
    entry.write_bytes(b"not a checkpoint")
    again = _canary("pytorch_fp32", seed=1)
    assert "parent_read_from_cache" not in again.metrics["timings"]
    assert {k: again.metrics[k] for k in JUDGED} == {k: first.metrics[k] for k in JUDGED}
    assert entry.stat().st_size > 1000  # rewritten whole


def test_the_key_covers_the_definition_and_the_data() -> None:
    import torch

    base = dict(
        definition="{}",
        binding="{}",
        profile="{}",
        device="cpu",
        seed=1,
        batches=torch.zeros(2, 3, dtype=torch.long),
        heldout=torch.zeros(1, 3, dtype=torch.long),
        init={"w": torch.zeros(2)},
    )
    k = parent_cache.key(**base)  # type: ignore[arg-type]
    assert parent_cache.key(**{**base, "definition": '{"name": "x"}'}) != k  # type: ignore[arg-type]
    assert parent_cache.key(**{**base, "batches": torch.ones(2, 3, dtype=torch.long)}) != k  # type: ignore[arg-type]
    assert parent_cache.key(**{**base, "init": {"w": torch.ones(2)}}) != k  # type: ignore[arg-type]
    assert parent_cache.key(**{**base, "seed": 2}) != k  # type: ignore[arg-type]
    assert parent_cache.key(**base) == k  # type: ignore[arg-type]


def test_the_least_recently_used_entries_go_beyond_the_limit(cache: Path) -> None:
    import os

    import torch

    for i, key in enumerate(("a", "b", "c")):
        parent_cache.store(cache, key, {"sgd": {"eval": [float(i)]}}, max_entries=2)
        os.utime(cache / "canary-parent" / f"{key}.pt", (1000 + i, 1000 + i))
    assert parent_cache.load(cache, "a") is None  # evicted when "c" came
    assert parent_cache.load(cache, "b") == {"sgd": {"eval": [1.0]}}  # a hit: now the most recently used
    parent_cache.store(cache, "d", {"sgd": {"eval": [3.0]}}, max_entries=2)
    assert sorted(p.stem for p in (cache / "canary-parent").glob("*.pt")) == ["b", "d"]
    assert torch.load(cache / "canary-parent" / "d.pt", weights_only=True) == {"sgd": {"eval": [3.0]}}
