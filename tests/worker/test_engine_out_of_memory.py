"""A stage that runs out of GPU memory (on a card other audits share, usually their load) runs again after the
memory comes back; only when every attempt runs out is it inconclusive (`error`), never the kernel's `fail`."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from worker import registry
from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.numerics import gpu_memory

STAGE = """
from pathlib import Path

import torch

from worker.report import StageResult, StageStatus

COUNTER = Path({counter!r})


def run(ctx):
    n = int(COUNTER.read_text()) if COUNTER.exists() else 0
    COUNTER.write_text(str(n + 1))
    if n < {ooms}:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB (a neighbour holds the rest)")
    return StageResult(name="{name}", status=StageStatus.passed, summary=f"ran on attempt {{n + 1}}")
"""


def _register(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    """The stage `name` from `source`, registered for this test only; its module's name."""
    package = f"oom_stages_{name}"  # a package per test: Python caches an imported package's folder
    pkg = tmp_path / package
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_modules", registry.stage_modules())  # this test's stage stays in this test
    registry.register_stage(f"{package}.{name}")
    return f"{package}.{name}"


def _stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, ooms: int) -> Path:
    counter = tmp_path / f"{name}.count"
    _register(tmp_path, monkeypatch, name, STAGE.format(counter=str(counter), ooms=ooms, name=name))
    return counter


def _audit(name: str):  # type: ignore[no-untyped-def]
    problem = load_catalogue().get("softmax")
    return {
        s.name: s
        for s in run_audit(
            problem, problem.example_solution("pytorch_fp32"), device="cpu", stages=("intake", name)
        ).stages
    }


def test_a_stage_that_ran_out_of_memory_once_runs_again_and_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = _stage(tmp_path, monkeypatch, "oom_once", ooms=1)
    stage = _audit("oom_once")["oom_once"]
    assert str(stage.status) == "passed", stage.summary
    assert stage.summary == "ran on attempt 2"
    assert stage.metrics["out_of_memory_retries"] == 1
    assert counter.read_text() == "2"


def test_a_stage_that_always_runs_out_is_inconclusive_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = _stage(tmp_path, monkeypatch, "oom_always", ooms=99)
    stages = _audit("oom_always")
    stage = stages["oom_always"]
    attempts = gpu_memory.OOM_RETRIES + 1
    assert str(stage.status) == "error"
    assert f"ran out of memory in oom_always on {attempts} attempt(s)" in stage.summary
    assert "not counted against the kernel" in stage.summary
    assert counter.read_text() == str(attempts)
    assert str(stages["verdict"].status) != "failed"


HOLDING_STAGE = """
import weakref

import torch

HELD = []  # weak references to what each attempt held when it ran out


def run(ctx):
    work = torch.zeros(1024)  # stands for the attempt's device tensors, alive in its frame
    HELD.append(weakref.ref(work))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
"""


def test_memory_is_given_back_only_after_the_failed_attempt_let_go_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocator's cache can return only blocks nothing holds: when run_stage gives memory back before a retry,
    the failed attempt's tensors must already be gone, or the retry's neighbours (the submission's process) find the
    card as full as before."""
    module = importlib.import_module(_register(tmp_path, monkeypatch, "holding", HOLDING_STAGE))
    alive_at_release: list[int] = []

    def release(device: str) -> None:
        alive_at_release.append(sum(ref() is not None for ref in module.HELD))

    monkeypatch.setattr(gpu_memory, "release", release)
    stage = _audit("holding")["holding"]
    assert str(stage.status) == "error", stage.summary
    assert len(module.HELD) == gpu_memory.OOM_RETRIES + 1
    assert alive_at_release, "run_stage never gave memory back"
    assert alive_at_release == [0] * len(alive_at_release), alive_at_release


CHILD_STAGE = """
import torch

from worker.report import StageResult, StageStatus

SEEN = []  # the submission's process as each attempt had it


def run(ctx):
    SEEN.append(ctx.sandbox())
    if len(SEEN) == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.63 GiB (the child holds 60 GiB)")
    return StageResult(name="child_held", status=StageStatus.passed, summary="ran on attempt 2")
"""


def test_a_retry_runs_in_a_new_submission_process_and_the_old_one_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's caching allocator keeps what the failed attempt reserved, and only ending the child frees it (a
    hostile one would not empty its cache when asked). On an H100 the retries of a canary at width 4096 waited for
    memory a process of the same audit held, through all three attempts."""
    module = importlib.import_module(_register(tmp_path, monkeypatch, "child_held", CHILD_STAGE))
    stage = _audit("child_held")["child_held"]
    assert str(stage.status) == "passed", stage.summary
    first, second = module.SEEN
    assert first is not second
    assert not first.alive, "the failed attempt's process still runs beside the retry"
