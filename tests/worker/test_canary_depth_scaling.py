"""A definition fixed wider than the canary model trains at its own width in a shallower model
(worker.canary.sizing): layers go, down to one, until the model fits the profile's max_params; the width never does.
The definitions are the SOL-ExecBench-style stand-ins of benchmarks/official_samples, whose model sizes are constant
axes, as SOL-ExecBench's own definitions have them."""

from __future__ import annotations

from pathlib import Path

from worker.canary.matching import site_for
from worker.canary.profiles import profile_for
from worker.canary.sizing import n_params
from worker.formats.loaders import load_definition
from worker.reference import Reference

SAMPLES = Path(__file__).resolve().parents[2] / "benchmarks" / "official_samples"


def _match(sample: str, **profile: int):  # type: ignore[no-untyped-def]
    d = load_definition(SAMPLES / sample / "definition.json")
    p = profile_for("gpu").model_copy(update=profile)
    return p, site_for(d, None, Reference.of(d).run_fn, p)


def test_a_gate_up_fixed_at_gemma_3_sizes_trains_in_the_deepest_model_that_fits() -> None:
    p, found = _match("gemma3_swiglu")  # d_model 3840, d_ff 15360: 1,069.6M parameters at the profile's 4 layers
    assert found.binding is not None and found.binding.site == "glu", found.how
    q = found.profile
    assert (q.d_model, q.d_ff) == (3840, 15360)  # the definition's width, kept
    assert 1 <= q.n_layers < p.n_layers
    assert n_params(q, found.binding) <= p.max_params
    assert (
        n_params(q.model_copy(update={"n_layers": q.n_layers + 1}), found.binding) > p.max_params
    )  # no shallower than needed
    assert f"keeps {q.n_layers} of the profile's {p.n_layers} layers" in found.how


def test_an_add_norm_at_nemotron_width_needs_one_layer_and_one_layer_past_the_limit_fits_no_site() -> None:
    _, found = _match("nemotron_rms_norm")  # hidden 8192
    assert found.binding is not None and found.binding.site == "add_norm", found.how
    assert found.profile.n_layers == 1 and found.profile.d_model == 8192
    _, refused = _match("nemotron_rms_norm", max_params=300_000_000)
    assert refused.binding is None
    assert "with one layer, past the gpu profile's 300M" in refused.how


def test_a_model_wider_than_the_profile_trains_adamw_at_a_rate_scaled_by_the_widths_ratio() -> None:
    p, found = _match("nemotron_rms_norm")  # hidden 8192: 32x the GPU profile's 256
    q = found.profile
    assert q.d_model == 8192 and q.adamw_lr == p.adamw_lr * p.d_model / 8192
    assert q.sgd_lr == p.sgd_lr  # clipped SGD stayed stable at width (H100, 2026-12-07): left as is
    assert f"8192 wide, 32x the profile's 256, AdamW trains at {q.adamw_lr:.3g}" in found.how
    narrow = profile_for("gpu").model_copy(update={"d_model": 16384})  # a profile already wider than the definition
    assert site_for(*_definition_and_run("nemotron_rms_norm"), narrow).profile.adamw_lr == narrow.adamw_lr


def _definition_and_run(sample: str):  # type: ignore[no-untyped-def]
    d = load_definition(SAMPLES / sample / "definition.json")
    return d, None, Reference.of(d).run_fn
