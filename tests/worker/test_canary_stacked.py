"""The canary's stacked training (worker.canary.stacked): the reference and its null runs trained together
must give each member the run it would have had alone, and keep members apart."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch

from worker.canary.binding import Kernel, bind
from worker.canary.data import draw_batches, split
from worker.canary.model import init_state
from worker.canary.profiles import CPU
from worker.canary.stacked import CanaryStopped, train_stacked
from worker.canary.train import perturbed_kernel, reference_kernel, train
from worker.catalogue import Catalogue, load_catalogue
from worker.reference import Reference

STEPS = 10
P = CPU.model_copy(update={"steps": STEPS, "checkpoints": (5, STEPS)})


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def _setup(catalogue: Catalogue, name: str) -> tuple[Any, Kernel, torch.Tensor, dict[str, torch.Tensor]]:
    problem = catalogue.get(name)
    assert problem.spec.canary is not None
    site = problem.spec.canary.site
    b = bind(site, problem.definition)
    ref = reference_kernel(Reference.of(problem.definition).run_fn)
    train_ids, _ = split(P.vocab_size, P.heldout_fraction)
    return b, ref, draw_batches(train_ids, STEPS, P.batch_size, P.seq_len, seed=3), init_state(P, site, 3)


def _max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_stacked_reference_and_null_runs_match_sequential_runs(catalogue: Catalogue, opt: str) -> None:
    b, ref, batches, init = _setup(catalogue, "embedding_backward")
    sequential = [
        train(P, b, ref, init, batches, opt, "cpu"),
        train(P, b, perturbed_kernel(ref, 11, "cpu"), init, batches, opt, "cpu"),
    ]
    stacked = train_stacked(P, b, [ref, perturbed_kernel(ref, 11, "cpu")], init, batches, opt, "cpu")
    for alone, together in zip(sequential, stacked):
        assert len(together.losses) == STEPS
        assert together.losses == pytest.approx(alone.losses, rel=1e-6, abs=1e-6)
        assert set(together.checkpoints) == {5, STEPS}
        for s in together.checkpoints:
            assert _max_weight_diff(alone.checkpoints[s], together.checkpoints[s]) < 1e-6
    # the members did train differently: the 1-ulp null is not a copy of the reference
    assert stacked[0].losses != stacked[1].losses


@pytest.mark.parametrize("problem", ["rmsnorm_backward", "cross_entropy"])
def test_stacked_matches_sequential_at_the_norm_and_loss_sites(catalogue: Catalogue, problem: str) -> None:
    b, ref, batches, init = _setup(catalogue, problem)
    alone = train(P, b, ref, init, batches, "sgd", "cpu")
    (together,) = train_stacked(P, b, [ref], init, batches, "sgd", "cpu")
    assert together.losses == pytest.approx(alone.losses, rel=1e-6, abs=1e-6)
    assert _max_weight_diff(alone.checkpoints[STEPS], together.checkpoints[STEPS]) < 1e-6


def test_a_diverging_member_stays_apart_from_the_others(catalogue: Catalogue) -> None:
    """A member whose op returns NaN diverges on its own: its neighbour trains as if alone,
    and its later checkpoints are its last (non-finite) weights, as in a single run."""
    b, ref, batches, init = _setup(catalogue, "embedding_backward")

    def poisoned(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        return [torch.full_like(o, math.nan) for o in ref(args, specs)]

    alone = train(P, b, ref, init, batches, "sgd", "cpu")
    good, bad = train_stacked(P, b, [ref, poisoned], init, batches, "sgd", "cpu")
    assert good.losses == pytest.approx(alone.losses, rel=1e-6, abs=1e-6)
    assert all(torch.isfinite(t).all() for t in good.checkpoints[STEPS].values())
    assert len(bad.losses) == 5 and not math.isfinite(bad.losses[-1])  # stopped at its first sync point, like train()
    assert not all(torch.isfinite(t).all() for t in bad.checkpoints[STEPS].values())


def test_a_set_stop_event_ends_the_training(catalogue: Catalogue) -> None:
    b, ref, batches, init = _setup(catalogue, "embedding_backward")
    stop = threading.Event()
    calls = 0

    def counting(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        nonlocal calls
        calls += 1
        if calls == 2:
            stop.set()
        return ref(args, specs)

    with pytest.raises(CanaryStopped):
        train_stacked(P, b, [counting], init, batches, "sgd", "cpu", stop=stop)
    assert calls == 2


def test_members_of_both_optimisers_in_one_pass_train_as_they_would_alone(catalogue: Catalogue) -> None:
    """SGD and AdamW members stacked in one pass (the canary's parent and child both train this way) each get
    the run they would have had alone, and the two optimisers' members stay apart."""
    b, ref, batches, init = _setup(catalogue, "embedding_backward")
    # a perturbed kernel draws its ulp moves from its own generator: one instance per run
    mixed = train_stacked(
        P,
        b,
        [ref, perturbed_kernel(ref, 11, "cpu"), ref, perturbed_kernel(ref, 11, "cpu")],
        init,
        batches,
        ["sgd", "sgd", "adamw", "adamw"],
        "cpu",
    )
    for j, opt in enumerate(("sgd", "adamw")):
        alone = [
            train(P, b, ref, init, batches, opt, "cpu"),
            train(P, b, perturbed_kernel(ref, 11, "cpu"), init, batches, opt, "cpu"),
        ]
        for single, together in zip(alone, mixed[2 * j : 2 * j + 2]):
            # a four-member batched matmul may round differently from a single one in the last place
            assert together.losses == pytest.approx(single.losses, rel=1e-5, abs=1e-5)
            for s in together.checkpoints:
                assert _max_weight_diff(single.checkpoints[s], together.checkpoints[s]) < 1e-5
    assert mixed[0].losses != mixed[2].losses  # SGD and AdamW runs differ
    with pytest.raises(ValueError, match="optimisers"):
        train_stacked(P, b, [ref, ref], init, batches, ["sgd"], "cpu")
