"""The embedding problems of the catalogue: definitions, workloads, oracles and example solutions.

Covers kernels/embedding_backward (the Triton solutions) and kernels/embedding_rmsnorm_backward
(all of it). Example solutions run in the real sandbox child process; Triton ones under the
Triton interpreter on the CPU. GPU-only solutions run in the tests marked `gpu`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.catalogue_support import SandboxPool, call, solution_ids
from worker.catalogue import Catalogue, Problem, load_catalogue
from worker.formats import Workload
from worker.inputs import Case, build_case
from worker.reference import Reference

PROBLEMS = ("embedding_backward", "embedding_rmsnorm_backward")
# the generator kinds worker.probes.distributions implements (see the probes engineer's spec)
GENERATOR_KINDS = {
    "uniform_ids",
    "zipf_ids",
    "real_text_ids",
    "hot_id",
    "padding_heavy",
    "normal",
    "positive",
    "shared_direction",
    "scalar",
    "from_axis",
}
BF16_ROUNDING = 1e-2  # normwise relative error a bf16 output of a correct kernel stays well below


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def rel_err(out: torch.Tensor, exact: torch.Tensor) -> float:
    exact = exact.double()
    return float((out.double() - exact).norm() / exact.norm())


def oracle_outputs(problem: Problem, case: Case) -> tuple[torch.Tensor, ...]:
    return tuple(problem.oracle()(*case.args(problem.definition)))


def cpu_case(problem: Problem, seed: int = 0) -> Case:
    """The first CPU workload, as the benchmark builds it (uniform random ids)."""
    return build_case(problem.definition, Reference.of(problem.definition), problem.workloads_cpu[0], seed)


def case_with(problem: Problem, case: Case, **inputs: Any) -> Case:
    return Case(axes=case.axes, inputs={**case.inputs, **inputs}, output_shapes=case.output_shapes)


def hot_id_inputs(problem: Problem, *, num_tokens: int, hot: int, vocab: int, hidden: int, seed: int) -> Case:
    """A batch where id 3 takes `hot` of the tokens, the rest uniform: a long sum into one row."""
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, vocab, (num_tokens,), generator=gen)
    indices[torch.randperm(num_tokens, generator=gen)[:hot]] = 3
    axes = {"num_tokens": num_tokens, "vocab_size": vocab, "hidden_size": hidden}
    defn = problem.definition
    inputs: dict[str, Any] = {}
    for name, spec in defn.inputs.items():
        if name == "indices":
            inputs[name] = indices
        elif spec.is_scalar:
            inputs[name] = {"num_embeddings": vocab, "padding_idx": -1, "eps": 1e-6}[name]
        else:
            shape = defn.shape_of(spec, axes)
            inputs[name] = torch.randn(shape, generator=gen).to(torch.bfloat16)
    shapes = {n: defn.shape_of(s, axes) for n, s in defn.outputs.items()}
    return Case(axes=axes, inputs=inputs, output_shapes=shapes)


# ---------------------------------------------------------------------------------------------
# definitions, workloads, audit specs


def test_both_problems_load(catalogue: Catalogue) -> None:
    for name in PROBLEMS:
        p = catalogue.get(name)
        assert p.workloads_gpu and p.workloads_cpu
        assert p.spec.order_free_axis == "num_tokens"
    fused = catalogue.get("embedding_rmsnorm_backward").definition
    assert list(fused.inputs) == ["indices", "weight", "gamma", "grad_output", "eps"]
    assert list(fused.outputs) == ["grad_weight", "grad_gamma"]
    assert fused.inputs["eps"].shape is None and fused.inputs["eps"].dtype == "float32"
    assert set(fused.var_axes) == {"num_tokens", "vocab_size", "hidden_size"}


@pytest.mark.parametrize("name", PROBLEMS)
def test_every_workload_builds(catalogue: Catalogue, name: str) -> None:
    p = catalogue.get(name)
    ref = Reference.of(p.definition)
    workloads: list[Workload] = [*p.workloads_gpu, *p.workloads_cpu]
    for w in workloads:
        case = build_case(p.definition, ref, w, seed=1)
        axes = case.axes
        idx = case.inputs["indices"]
        assert idx.dtype == torch.int64 and idx.shape == (axes["num_tokens"],)
        assert int(idx.min()) >= 0 and int(idx.max()) < axes["vocab_size"]
        go = case.inputs["grad_output"]
        assert go.dtype == torch.bfloat16 and go.shape == (axes["num_tokens"], axes["hidden_size"])
        assert case.output_shapes["grad_weight"] == (axes["vocab_size"], axes["hidden_size"])
        if name == "embedding_rmsnorm_backward":
            assert case.inputs["weight"].shape == (axes["vocab_size"], axes["hidden_size"])
            assert case.inputs["gamma"].shape == (axes["hidden_size"],)
            assert isinstance(case.inputs["eps"], float) and case.inputs["eps"] > 0
            assert case.output_shapes["grad_gamma"] == (axes["hidden_size"],)


def test_fused_audit_spec_is_complete(catalogue: Catalogue) -> None:
    p = catalogue.get("embedding_rmsnorm_backward")
    spec = p.spec
    defn = p.definition
    assert (spec.tolerance.atol, spec.tolerance.rtol, spec.tolerance.min_match) == (1e-2, 1e-2, 0.99)
    gw, gg = spec.budgets["grad_weight"], spec.budgets["grad_gamma"]
    assert gw.group_dims == [0] and gw.bucket_by is not None and gw.bucket_by.kind == "index_count"
    assert gw.bucket_by.input == "indices"
    assert gg.group_dims == [] and gg.bucket_by is not None and gg.bucket_by.kind == "reduction_length"
    assert gg.bucket_by.axis == "num_tokens"
    assert spec.canary is not None and spec.canary.site == "embedding_norm"
    must_list = {n for n, s in defn.inputs.items() if s.is_scalar or not s.dtype.startswith(("float", "bfloat"))}
    kinds: set[str] = set()
    for probe in spec.probes:
        assert probe.why.strip()
        assert set(probe.axes) == set(defn.var_axes)
        assert set(probe.axes_for("gpu")) == set(defn.var_axes)
        assert set(probe.inputs) <= set(defn.inputs)
        assert must_list <= set(probe.inputs), f"{probe.name}: int and scalar inputs must be listed"
        assert next(iter(probe.inputs)) == "indices", f"{probe.name}: ids first, later generators read them"
        assert set(probe.noncontiguous) <= set(defn.inputs)
        kinds |= {g.kind for g in probe.inputs.values()}
        # a CPU audit of one example stays small: the table and the batch fit in a few MB
        assert probe.axes["num_tokens"] * probe.axes["hidden_size"] <= 2**20
    assert kinds <= GENERATOR_KINDS
    assert {"real_text_ids", "zipf_ids", "hot_id", "shared_direction"} <= kinds
    assert any(pr.adversarial for pr in spec.probes)
    assert any(pr.noncontiguous for pr in spec.probes)
    assert max(pr.axes_for("gpu")["num_tokens"] for pr in spec.probes) >= 65536
    hiddens = [pr.axes["hidden_size"] for pr in spec.probes]
    assert any(h & (h - 1) for h in hiddens), "an odd (not a power of two) hidden size"
    zipf_s = {g.params.get("s") for pr in spec.probes for g in pr.inputs.values() if g.kind == "zipf_ids"}
    assert {1.0, 1.2} <= zipf_s
    stds = {g.params.get("std") for pr in spec.probes for n, g in pr.inputs.items() if n == "grad_output"}
    assert {1e-4, 1e3} <= stds


def test_solution_files_name_their_problem(catalogue: Catalogue) -> None:
    for name in PROBLEMS:
        p = catalogue.get(name)
        for sname, sol in p.example_solutions().items():
            assert sol.name == sname and sol.definition == name
    eb = catalogue.get("embedding_backward").example_solutions()
    assert eb["triton_bf16_atomic"].spec.target_hardware == ["B200"]  # GPU only (bf16 atomics)
    fused = catalogue.get("embedding_rmsnorm_backward").example_solutions()
    assert set(fused) == {"pytorch_fp32", "triton_fp32", "pytorch_bf16_embed_accum", "triton_bf16_embed_atomic"}
    assert fused["triton_bf16_embed_atomic"].spec.target_hardware == ["B200"]
    # the audit.json is valid JSON a user can read and edit
    json.loads((catalogue.get("embedding_rmsnorm_backward").folder / "audit.json").read_text())


# ---------------------------------------------------------------------------------------------
# reference vs oracle


# ---------------------------------------------------------------------------------------------
# example solutions in the sandbox, on the CPU


@pytest.mark.parametrize(("problem_name", "solution"), solution_ids(PROBLEMS))
def test_cpu_solution_matches_oracle_on_uniform_ids(
    catalogue: Catalogue, pool: SandboxPool, problem_name: str, solution: str
) -> None:
    p = catalogue.get(problem_name)
    case = cpu_case(p, seed=11)
    outs = call(pool.get(p, solution), p, case)
    exact = oracle_outputs(p, case)
    for out, ex, oname in zip(outs, exact, p.definition.outputs):
        assert tuple(out.shape) == case.output_shapes[oname]
        assert not torch.isnan(out).any(), f"{solution}: {oname} not fully written"
        assert rel_err(out, ex) < BF16_ROUNDING, (solution, oname)


@pytest.mark.parametrize("solution", ["pytorch_fp32", "triton_fp32"])
def test_embedding_backward_padding_and_strides(catalogue: Catalogue, pool: SandboxPool, solution: str) -> None:
    p = catalogue.get("embedding_backward")
    base = cpu_case(p, seed=12)
    pad = int(base.inputs["indices"][0])
    case = case_with(p, base, padding_idx=pad)
    exact = oracle_outputs(p, case)[0]
    assert exact[pad].abs().sum() == 0 and base.inputs["grad_output"].abs().sum() > 0
    box = pool.get(p, solution)
    for noncontig in (None, [0, 1]):  # indices and grad_output as strided views
        (out,) = call(box, p, case, noncontiguous=noncontig)
        assert out[pad].abs().sum() == 0
        assert rel_err(out, exact) < BF16_ROUNDING


@pytest.mark.parametrize("solution", ["pytorch_fp32", "triton_fp32", "pytorch_bf16_embed_accum"])
def test_fused_strided_inputs(catalogue: Catalogue, pool: SandboxPool, solution: str) -> None:
    p = catalogue.get("embedding_rmsnorm_backward")
    case = cpu_case(p, seed=13)
    exact = oracle_outputs(p, case)
    outs = call(pool.get(p, solution), p, case, noncontiguous=[0, 1, 3])  # indices, weight, grad_output strided
    for out, ex in zip(outs, exact):
        assert rel_err(out, ex) < BF16_ROUNDING


def hot_row_errors(p: Problem, pool: SandboxPool, case: Case, solutions: list[str]) -> dict[str, float]:
    """Error of row 3 (the hot id) of grad_weight per solution, plus the ideal output's under 'ideal'."""
    exact = oracle_outputs(p, case)[0][3]
    errs = {"ideal": rel_err(exact.to(torch.bfloat16), exact)}
    for s in solutions:
        out = call(pool.get(p, s), p, case)[0]
        errs[s] = rel_err(out[3], exact)
    return errs


def test_fused_bf16_accumulation_shows_on_a_hot_row(catalogue: Catalogue, pool: SandboxPool) -> None:
    p = catalogue.get("embedding_rmsnorm_backward")
    case = hot_id_inputs(p, num_tokens=4096, hot=2000, vocab=2048, hidden=64, seed=7)
    assert int((case.inputs["indices"] == 3).sum()) >= 2000
    errs = hot_row_errors(p, pool, case, ["pytorch_fp32", "triton_fp32", "pytorch_bf16_embed_accum"])
    assert errs["pytorch_fp32"] < 1.5 * errs["ideal"]
    assert errs["triton_fp32"] < 1.5 * errs["ideal"]
    assert errs["pytorch_bf16_embed_accum"] > 10 * errs["pytorch_fp32"], errs
    # the flawed kernel is right where rows are short: the benchmark's uniform ids cannot see it
    uniform = cpu_case(p, seed=14)
    out = call(pool.get(p, "pytorch_bf16_embed_accum"), p, uniform)[0]
    exact = oracle_outputs(p, uniform)[0]
    assert rel_err(out, exact) < 1.5 * rel_err(exact.to(torch.bfloat16), exact)


def test_embedding_backward_triton_fp32_hot_row_is_ideal(catalogue: Catalogue, pool: SandboxPool) -> None:
    p = catalogue.get("embedding_backward")
    case = hot_id_inputs(p, num_tokens=4096, hot=2000, vocab=2048, hidden=64, seed=8)
    errs = hot_row_errors(p, pool, case, ["triton_fp32"])
    assert errs["triton_fp32"] < 1.5 * errs["ideal"], errs


# ---------------------------------------------------------------------------------------------
# GPU: the Triton solutions on CUDA, including the bf16-atomic ones


def gpu_triton_solutions() -> list[tuple[str, str]]:
    cat = load_catalogue()
    return [(p, n) for p in PROBLEMS for n, s in cat.get(p).example_solutions().items() if "triton" in s.spec.languages]


@pytest.fixture(scope="module")
def gpu_pool() -> Iterator[SandboxPool]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    p = SandboxPool("cuda")
    yield p
    p.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("problem_name", "solution"), gpu_triton_solutions())
def test_gpu_triton_solution(catalogue: Catalogue, gpu_pool: SandboxPool, problem_name: str, solution: str) -> None:
    """Every Triton example passes on the benchmark's own (uniform-id) GPU workload; the bf16-atomic
    ones then lose a hot row, the fp32 ones keep it at the ideal output's error."""
    p = catalogue.get(problem_name)
    box = gpu_pool.get(p, solution)
    case = build_case(p.definition, Reference.of(p.definition), p.workloads_gpu[0], seed=21)
    exact = oracle_outputs(p, case)
    strided = [i for i, a in enumerate(case.args(p.definition)) if isinstance(a, torch.Tensor)]
    for noncontig in (None, strided):
        outs = call(box, p, case, noncontiguous=noncontig)
        for out, ex, oname in zip(outs, exact, p.definition.outputs):
            assert not torch.isnan(out).any(), f"{solution}: {oname} not fully written"
            assert rel_err(out, ex) < BF16_ROUNDING, (solution, oname, noncontig)
    axes = case.axes
    hot = hot_id_inputs(
        p, num_tokens=axes["num_tokens"], hot=2000, vocab=axes["vocab_size"], hidden=axes["hidden_size"], seed=22
    )
    errs = hot_row_errors(p, gpu_pool, hot, [solution])
    if "bf16" in solution:
        assert errs[solution] > 5 * errs["ideal"], errs
    else:
        assert errs[solution] < 1.5 * errs["ideal"], errs
