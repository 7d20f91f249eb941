"""benchmarks/official_samples.py: its stand-in definitions load as problems, and it lays out the files upstream's
tests leave to themselves (a workload for the RMSNorm sample, the evil samples' problem and assembled solution)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.official_samples import SAMPLES, STAND_INS, VECADD, prepare
from worker.catalogue import load_problem
from worker.formats import load_solution


# the definition each sample solution names (its "definition" field): a stand-in must carry it, or no sample applies
NAMED_BY_THE_SAMPLES = {
    "flux_rope": "black-forest-labs_FLUX.1-schnell_flux_rope_apply_rotation",
    "gemma3_swiglu": "google_gemma-3-12b-it_gemma3_fused_gate_up_projection_with_swiglu",
    "jamba_attn_proj": "ai21labs_AI21-Jamba-Reasoning-3B_attention_output_projection_with_residual",
    "nemotron_rms_norm": "nvidia_Llama-3.3-Nemotron-70B-Select_rms_norm",
    "olmo3_post_norm": "allenai_Olmo-3-1025-7B_post_norm_residual",
}


def test_every_stand_in_is_listed() -> None:
    assert {s.problem for s in SAMPLES if not s.official} == set(NAMED_BY_THE_SAMPLES)
    assert {p.name for p in STAND_INS.iterdir() if p.is_dir()} == set(NAMED_BY_THE_SAMPLES)


@pytest.mark.parametrize("folder", sorted(NAMED_BY_THE_SAMPLES))
def test_each_stand_in_loads_under_the_name_its_samples_use(folder: str) -> None:
    problem = load_problem(STAND_INS / folder)
    assert problem.name == NAMED_BY_THE_SAMPLES[folder]
    assert problem.workloads("gpu")
    assert problem.spec.canary is None and not problem.spec.probes  # no audit.json: the generic path judges them


def test_prepare_assembles_the_evil_sample_as_upstreams_test_does(tmp_path: Path) -> None:
    evil = tmp_path / "evil" / "evil_timing_bypass"
    evil.mkdir(parents=True)
    kernel = "import torch\n\n\ndef run(x, y):\n    return x + y\n"
    solution = {
        "name": "evil_timing_bypass",
        "definition": VECADD["name"],
        "author": "test",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "kernel.py::run"},
        "sources": [{"path": "kernel.py", "content": "placeholder"}],
    }
    (evil / "solution.json").write_text(json.dumps(solution))
    (evil / "kernel.py").write_text(kernel)
    (tmp_path / "rmsnorm").mkdir()
    (tmp_path / "rmsnorm" / "workload.jsonl").write_text("kept\n")
    prepare(tmp_path)
    assembled = load_solution(evil / "solution_assembled.json")
    assert [(s.path, s.content) for s in assembled.sources] == [("kernel.py", kernel)]
    vecadd = load_problem(tmp_path / "evil" / "vecadd")
    assert vecadd.name == "evil_test_vecadd" and [w.axes["n"] for w in vecadd.workloads("gpu")] == [256, 512]
    assert (tmp_path / "rmsnorm" / "workload.jsonl").read_text() == "kept\n"  # a workload already there is kept
