"""Random inputs made from recipes on both sides of the trust boundary (worker.generated), as the GPU benchmark
does: the child makes them from their seeds, the parent checks what it made by digest and judges the outputs
against its own copy. Exercised here on the CPU by asking the stage for the same path."""

from __future__ import annotations

import torch

from worker import generated
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.stages import benchmark
from worker.formats import Solution, SolutionSpec, SourceFile
from worker.inputs import Recipe, build_case
from worker.reference import Reference
from worker.stages.result import StageStatus

EMB = load_catalogue().get("embedding_backward")


def _solution(body: str) -> Solution:
    return Solution(
        name="inline",
        definition=EMB.name,
        spec=SolutionSpec(language="python", entry_point="kernel.py::run", destination_passing_style=True),
        sources=[SourceFile(path="kernel.py", content=body)],
    )


def _benchmark(solution: Solution, seed: int = 3) -> tuple[StageStatus, str, dict]:
    ctx = AuditContext(problem=EMB, solution=solution, device="cpu", seed=seed, inputs_made_in_child=True)
    try:
        result = benchmark.run(ctx)
    finally:
        ctx.close()
    return result.status, result.summary, result.metrics


def test_a_recipe_makes_the_same_tensor_every_time_and_a_new_seed_another() -> None:
    a = generated.make(7, (64, 33), torch.bfloat16)
    assert torch.equal(a, generated.make(7, (64, 33), torch.bfloat16))
    assert not torch.equal(a, generated.make(8, (64, 33), torch.bfloat16))
    wire = generated.wire(7, (64, 33), torch.bfloat16)
    assert generated.is_wire(wire) and torch.equal(generated.from_wire(wire, "cpu"), a)


def test_the_digest_sees_one_changed_element_and_a_permutation() -> None:
    t = generated.make(1, (1000,), torch.float32)
    d = generated.digest(t)
    assert d == generated.digest(t.clone())
    one = t.clone()
    one[500] = torch.nextafter(one[500], torch.tensor(float("inf")))
    assert generated.digest(one) != d
    assert generated.digest(t.flip(0)) != d
    assert generated.digest(t.reshape(10, 100)) != d  # the shape is part of it


def test_a_lazy_case_sends_recipes_and_makes_the_same_values_itself() -> None:
    w = EMB.workloads("cpu")[0]
    ref = Reference.of(EMB.definition)
    lazy = build_case(EMB.definition, ref, w, 5, lazy=True)
    eager = build_case(EMB.definition, ref, w, 5)
    made = lazy.recipes(EMB.definition)
    assert made and all(isinstance(r, Recipe) for r in made.values())
    wire = lazy.wire_args(EMB.definition)
    for i in made:
        assert generated.is_wire(wire[i])
        assert torch.equal(generated.from_wire(wire[i], "cpu"), eager.args(EMB.definition)[i])
    assert lazy.nbytes(EMB.definition) == eager.nbytes(EMB.definition)


def test_a_correct_kernel_passes_with_inputs_made_in_its_process() -> None:
    status, summary, metrics = _benchmark(EMB.example_solution("pytorch_fp32"))
    assert status is StageStatus.passed, summary
    assert metrics["inputs_mutated"] == []


def test_a_kernel_that_writes_into_its_input_is_seen_through_the_digest() -> None:
    body = EMB.example_solution("pytorch_fp32").sources[0].content + "\n    grad_output.zero_()\n"
    status, summary, metrics = _benchmark(_solution(body))
    assert status is StageStatus.passed, summary  # the benchmark notes mutation; the probes' check fails it
    assert metrics["inputs_mutated"] == ["grad_output"]


def test_a_kernel_that_replaces_the_input_generator_gets_no_pass() -> None:
    """Hostile: the submission swaps the child's generator for one that makes zeros (all-zero gradients make a
    zero output that is trivially "right" for those inputs); the parent's digests disagree and nothing is judged."""
    body = """
import torch
import worker.generated as g

def _zeros(seed, shape, dtype, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)

g.make = _zeros

def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    grad_weight.zero_()
"""
    status, summary, _ = _benchmark(_solution(body))
    assert status is StageStatus.error, summary
    assert "not the ones this process made" in summary
