"""The submission's checkpoint weights cross back as one tensor (worker.canary.checkpoint_wire), and the parent
takes nothing from it but what it checks: the exact shape and dtype, then its own held-out evaluation.

The forgeries are real submissions that replace the child's "canary_train" handler
(tests/worker/cheats/exploits/forge_canary_weights.py), run through the real canary stage in a sandbox child on
the catalogue's embedding-backward problem, with the CPU profile shortened to 20 steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.canary import checkpoint_wire
from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.formats import Solution
from worker.stages import canary as canary_stage
from worker.stages.result import StageStatus

EXPLOITS = Path(__file__).resolve().parent / "cheats" / "exploits"
SHORT = profile_for("cpu", steps=20, checkpoints=(10, 20), fidelity_steps=(0, 20), seed_pool=None)
PROBLEM = load_catalogue().get("embedding_backward")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAUDIT_CACHE_DIR", str(tmp_path))


def _init() -> dict[str, torch.Tensor]:
    return {"b": torch.arange(6.0).reshape(2, 3), "a": torch.arange(4.0) + 100}


def test_pack_and_unpack_give_back_every_run_and_step() -> None:
    init = _init()
    runs = [{s: {k: v + 10 * r + s for k, v in init.items()} for s in (1, 2)} for r in range(2)]
    wire = checkpoint_wire.pack(runs, [1, 2], init, torch.device("cpu"))
    assert wire.shape == (2, 2, 10) and wire.dtype == torch.float32
    back = checkpoint_wire.unpack(wire, 2, [1, 2], init)
    for r in range(2):
        for s in (1, 2):
            assert set(back[r][s]) == {"a", "b"}
            for k in init:
                assert torch.equal(back[r][s][k], runs[r][s][k])


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(2, 2, 9),
        torch.zeros(2, 2, 10, dtype=torch.float64),
        torch.zeros(1, 2, 10),
        torch.zeros(20),
        torch.nn.Parameter(torch.zeros(2, 2, 10)),
        [0.0] * 40,
        None,
    ],
)
def test_unpack_refuses_anything_but_the_exact_tensor(bad: object) -> None:
    with pytest.raises(ValueError):
        checkpoint_wire.unpack(bad, 2, [1, 2], _init())


def _forgery(mode: str) -> Solution:
    source = (EXPLOITS / "forge_canary_weights.py").read_text().replace("__MODE__", mode)
    return Solution.model_validate(
        {
            "name": f"forge_canary_{mode}",
            "definition": "embedding_backward",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": True},
            "sources": [{"path": "k.py", "content": source}],
        }
    )


def _canary(solution: Solution) -> tuple[StageStatus, str]:
    ctx = AuditContext(problem=PROBLEM, solution=solution, device="cpu", seed=5)
    try:
        result = canary_stage.run(ctx, SHORT)
    finally:
        ctx.close()
    return result.status, result.summary


def test_untrained_weights_sent_as_trained_fail_on_held_out_text() -> None:
    status, summary = _canary(_forgery("init"))
    assert status is StageStatus.failed, summary
    assert "held-out loss is worse" in summary


def test_weights_of_the_wrong_shape_fail_the_stage_as_unusable() -> None:
    status, summary = _canary(_forgery("shape"))
    assert status is StageStatus.failed, summary
    assert "unusable weights" in summary and "expected float32 (2, 2," in summary
