"""Every generic probe's inputs lie in its reference's domain.

A probe whose inputs the reference rejects measures nothing: on the CPU it is dropped as "not applicable", and on a
GPU an out-of-range index in the trusted reference is a device-side assert that ends the audit process's CUDA
context. The bug this guards: inputs a probe did not list were made by the base workload's custom generator with
the base workload's scalars (`num_segments = 65536`) at the probe's drawn axes (`num_segments = 49872`), so segment
ids ran past the output's rows.
"""

from __future__ import annotations

import pytest
import torch

from worker.catalogue import load_catalogue
from worker.generic.spec import derive_plan
from worker.probes.distributions import ProbeInputError, ProbeSources, build_probe_case
from worker.reference import Reference

CATALOGUE = load_catalogue()


def _cases(problem, profile: str, seed: int):  # type: ignore[no-untyped-def]
    """Each probe's name and case; a probe that cannot be built yields its error instead (it makes the stage an
    error in an audit, so it is a finding too)."""
    workloads = problem.workloads(profile)
    plan = derive_plan(problem.definition, workloads, profile, seed, Reference.of(problem.definition))
    sources = ProbeSources(reference=Reference.of(problem.definition), workloads=workloads)
    for probe in plan.spec.probes:
        try:
            yield probe.name, build_probe_case(problem.definition, probe, profile, seed, sources)
        except ProbeInputError as err:
            yield probe.name, err


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_custom_inputs_follow_the_probes_scalars(profile: str, seed: int) -> None:
    problem = CATALOGUE.get("segment_mean")
    seen = 0
    for name, case in _cases(problem, profile, seed):
        assert not isinstance(case, ProbeInputError), case
        segments = case.inputs["num_segments"]
        assert segments == case.axes["num_segments"], name
        ids = case.inputs["segment_ids"]
        assert int(ids.min()) >= 0 and int(ids.max()) < segments, (
            f"{name}: ids up to {int(ids.max())}, {segments} segments"
        )
        seen += 1
    assert seen >= 10


@pytest.mark.parametrize("name", sorted(p.name for p in CATALOGUE))
def test_the_reference_accepts_every_generic_probe_case(name: str) -> None:
    problem = CATALOGUE.get(name).as_uncurated()
    reference = Reference.of(problem.definition)
    rejected = {}
    for probe, case in (c for seed in (5, 6, 7) for c in _cases(problem, "cpu", seed)):
        if isinstance(case, ProbeInputError):
            rejected[probe] = f"not built: {case}"[:200]
            continue
        try:
            with torch.no_grad():
                reference.run(case.args(problem.definition))
        except Exception as err:  # noqa: BLE001 - any rejection is the finding
            rejected[probe] = f"{type(err).__name__}: {err}"[:200]
    assert not rejected
