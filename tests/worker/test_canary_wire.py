"""The submission's checkpoint weights cross back as pieces of rows (worker.canary.checkpoint_wire), and the parent
takes nothing from them but what it checks: their count, exact shapes and dtype, then its own held-out evaluation.

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


@pytest.mark.parametrize(("piece", "per_row"), [(1 << 28, 1), (10, 1), (4, 3), (1, 10)])
def test_pack_and_unpack_give_back_every_run_and_step(piece: int, per_row: int) -> None:
    init = _init()
    runs = [{s: {k: v + 10 * r + s for k, v in init.items()} for s in (1, 2)} for r in range(2)]
    expected = [{s: dict(states[s]) for s in states} for states in runs]
    wire = checkpoint_wire.pack(runs, [1, 2], init, torch.device("cpu"), piece)
    assert len(wire) == 2 * 2 * per_row and all(w.dtype == torch.float32 and w.dim() == 1 for w in wire)
    assert max(w.numel() for w in wire) <= piece and sum(w.numel() for w in wire) == 2 * 2 * 10
    assert runs == [{}, {}]  # handed over: no checkpoint is held twice
    back = checkpoint_wire.unpack(wire, 2, [1, 2], init, piece)
    for r in range(2):
        for s in (1, 2):
            assert set(back[r][s]) == {"a", "b"}
            for k in init:
                assert torch.equal(back[r][s][k], expected[r][s][k])


def test_unpack_hands_out_views_of_the_pieces_not_a_second_copy() -> None:
    """A parameter inside one piece is a view of it: joining whole rows first held every checkpoint twice in the
    parent (at width 4096, 14 GB more on a card the submission's training shares)."""
    init = _init()  # sorted: a (4 elements) then b (6): with pieces of 4, a is piece 0, b straddles pieces 1 and 2
    wire = checkpoint_wire.pack([{1: init}], [1], init, torch.device("cpu"), 4)
    back = checkpoint_wire.unpack(wire, 1, [1], init, 4)[0][1]
    assert back["a"].untyped_storage().data_ptr() == wire[0].untyped_storage().data_ptr()
    assert torch.equal(back["a"], init["a"]) and torch.equal(back["b"], init["b"])


OTHER_DEVICE = "cuda" if torch.cuda.is_available() else "meta"  # meta: on the CPU, a second device with no values


def test_pieces_of_one_row_on_different_devices_make_one_state() -> None:
    """On a full card a piece that cannot be exported or copied on the device crosses through the host
    (worker.sandbox.device_share), the rest stay on the device: one row can hold both. Joined as they came, they
    raised "Expected all tensors to be on the same device" in the canary of SOL-ExecBench's Gemma 3 gate-up at its
    own width (H100)."""
    init = _init()
    wire = checkpoint_wire.pack([{1: init}], [1], init, torch.device("cpu"), 5)  # b straddles pieces 0 and 1
    wire[0] = wire[0].to(OTHER_DEVICE)
    back = checkpoint_wire.unpack(wire, 1, [1], init, 5)[0][1]
    assert back["a"].device.type == back["b"].device.type == OTHER_DEVICE  # b joined on its first piece's device
    if OTHER_DEVICE != "meta":
        assert torch.equal(back["a"].cpu(), init["a"]) and torch.equal(back["b"].cpu(), init["b"])


@pytest.mark.parametrize(
    "bad",
    [
        [torch.zeros(9)] * 4,
        [torch.zeros(10, dtype=torch.float64)] * 4,
        [torch.zeros(10)] * 3,
        [torch.zeros(10)] * 5,
        [torch.zeros(2, 2, 10)],
        [torch.zeros(2, 10)] * 4,
        [torch.nn.Parameter(torch.zeros(10))] * 4,
        torch.zeros(2, 2, 10),
        [[0.0] * 10] * 4,
        None,
    ],
)
def test_unpack_refuses_anything_but_the_exact_pieces(bad: object) -> None:
    with pytest.raises(ValueError):
        checkpoint_wire.unpack(bad, 2, [1, 2], _init())


def test_unpack_refuses_a_short_last_piece() -> None:
    init = _init()
    wire = checkpoint_wire.pack([{1: init} for _ in range(2)], [1], init, torch.device("cpu"), 4)
    wire[-1] = wire[-1][:-1]
    with pytest.raises(ValueError, match="expected float32"):
        checkpoint_wire.unpack(wire, 2, [1], init, 4)


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
    assert "unusable weights" in summary and "1 pieces of checkpoint weights, expected 4" in summary


def test_a_piece_one_element_short_fails_the_stage_as_unusable() -> None:
    status, summary = _canary(_forgery("piece"))
    assert status is StageStatus.failed, summary
    assert "unusable weights" in summary and "piece 3 of the checkpoint weights is torch.float32" in summary


def test_a_real_canary_sends_its_weights_in_many_pieces_and_passes() -> None:
    """The pieces through the real sandbox child: rows cut in several pieces each (the default piece holds a row of
    up to 268M parameters; this model's rows are far smaller)."""
    profile = SHORT.model_copy(update={"wire_piece_elements": 50_000})
    ctx = AuditContext(problem=PROBLEM, solution=PROBLEM.example_solution("pytorch_fp32"), device="cpu", seed=5)
    try:
        result = canary_stage.run(ctx, profile)
    finally:
        ctx.close()
    assert result.status is StageStatus.passed, result.summary
    assert result.metrics["model"]["parameters"] > 3 * 50_000  # so each row crossed as several pieces
