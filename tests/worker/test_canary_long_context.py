"""The canary's long-context fidelity check: which window it draws, and when a definition's axes let it run."""

from __future__ import annotations

import torch

from worker.canary.data import canary_text
from worker.canary.families import FAMILIES
from worker.canary.profiles import profile_for
from worker.catalogue import load_catalogue
from worker.canary.matching import site_for
from worker.formats import Definition
from worker.reference import Reference
from worker.stages.canary.fidelity import LONG_CONTEXT_SITES, only_var_axes_moved

P = profile_for("cpu", fidelity_context=512)


def test_the_long_window_is_real_training_text_of_the_profiles_length_and_off_when_asked() -> None:
    text = canary_text(P, seed=5)
    assert text.long_window is not None and text.long_window.shape == (1, 513)
    assert text.long_window.dtype == torch.int32
    # ids of the training stream in order: some window of the batches' own stream holds the same ids somewhere
    assert int(text.long_window.max()) < P.vocab_size and len(set(text.long_window[0].tolist())) > 50
    assert canary_text(profile_for("cpu", fidelity_context=0), seed=5).long_window is None
    assert torch.equal(canary_text(P, seed=5).long_window, text.long_window)  # the same for every run of one seed


def test_only_sites_whose_op_reduces_over_the_sequence_take_the_long_window() -> None:
    assert set(FAMILIES) >= LONG_CONTEXT_SITES
    assert "attention" in LONG_CONTEXT_SITES and "linear" not in LONG_CONTEXT_SITES


def _attention(seq_axis_type: str) -> tuple[Definition, list[torch.Tensor], list[torch.Tensor]]:
    d = load_catalogue().get("attention_forward").definition
    axes = d.model_dump(mode="json")["axes"]
    axes["seq_len"] = {"type": "const", "value": 64} if seq_axis_type == "const" else {"type": "var"}
    d = Definition.model_validate({**d.model_dump(mode="json"), "axes": axes})
    short = [torch.zeros(32, 4, 64, 16) for _ in range(3)]
    long = [torch.zeros(1, 4, 8192, 16) for _ in range(3)]
    return d, short, long


def test_the_long_window_runs_only_where_the_definition_lets_the_sequence_axis_vary() -> None:
    problem = load_catalogue().get("attention_forward")  # the catalogue's own reference, trusted
    binding = site_for(problem.definition, None, Reference.of(problem.definition).run_fn, profile_for("cpu")).binding
    assert binding is not None
    d_var, short, long = _attention("var")
    assert only_var_axes_moved(d_var, binding, short, long)
    d_const, short, long = _attention("const")
    assert not only_var_axes_moved(d_const, binding, short, long)
    # a rank the definition does not declare is refused too
    assert not only_var_axes_moved(d_var, binding, short, [t[0] for t in long])
