"""The catalogue problems added to measure the generic path: SOL-ExecBench definitions with no audit.json and no
oracle.py, except the ones curated afterwards because the generic path missed their known-bad example
(CURATED: benchmarks/generic_catalogue.py's CURATED_AFTER_GENERIC, still measured there with both stripped).

Every folder in NEW is loaded through worker.catalogue.load_catalogue(); its definition must
validate, its reference must run on each CPU workload and give outputs of the declared shapes
and dtypes, and its correct example (run in the real sandbox child) must match the reference
on a CPU workload under the benchmark's elementwise rule. Each known-bad example is then run
on one targeted input standing for the real-use failure it models (large logits, an all-zero
padding row, a 1M-token position, tied bf16 logits, ...): there the correct example still
matches the reference and the known-bad one does not, which shows the flaw is real and the
input that exposes it is known, whether or not the benchmark's random workloads expose it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from benchmarks.expectations import KNOWN_BAD
from benchmarks.generic_catalogue import CURATED_AFTER_GENERIC
from tests.catalogue_support import SandboxPool, call
from worker.catalogue import Catalogue, Problem, load_catalogue
from worker.inputs import Case, build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.tolerance import compare_output
from worker.probes.distributions import build_probe_case
from worker.problem_spec import Tolerance
from worker.reference import Reference

# problem -> (correct example, known-bad examples)
NEW: dict[str, tuple[str, tuple[str, ...]]] = {
    "softmax": ("pytorch_fp32", ("pytorch_no_max_subtraction", "triton_no_max_subtraction")),
    "log_softmax": ("pytorch_logsumexp", ("pytorch_log_of_softmax",)),
    "layernorm_forward": ("pytorch_two_pass", ("pytorch_one_pass_variance",)),
    "fused_add_rmsnorm": ("pytorch_fp32", ("pytorch_bf16_row_sum",)),
    "rope": ("pytorch_fp64_angles", ("pytorch_fp32_angles", "pytorch_bf16_inv_freq")),
    "swiglu": ("pytorch_fp32", ("pytorch_exp_ratio_sigmoid",)),
    "geglu": ("pytorch_fp32", ("pytorch_exp_ratio_tanh",)),
    "attention_forward": ("pytorch_fp32", ("pytorch_bf16_accumulator",)),
    "attention_decode_gqa": ("pytorch_fp32", ("pytorch_bf16_accumulator",)),
    "gemm_bias_gelu": ("pytorch_fp32", ("pytorch_bf16_split_k",)),
    "moe_topk_routing": ("pytorch_stable_sort", ("pytorch_ties_high_id", "pytorch_bf16_softmax")),
    "top_k_renorm_probs": ("pytorch_stable_topk", ("pytorch_threshold_keeps_ties",)),
    "quantize_fp8_per_token": ("pytorch_clamped", ("pytorch_no_amax_floor",)),
    "cumsum": ("pytorch_fp32", ("pytorch_bf16_block_carry",)),
    "segment_mean": ("pytorch_fp32", ("pytorch_bf16_accum",)),
}
# curated after the generic path missed their known-bad example (benchmarks/results/generic_catalogue_cpu.md)
CURATED = {"layernorm_forward", "rope"}
BAD_IDS = [(p, b) for p, (_, bads) in NEW.items() for b in bads]
# further correct examples, checked like the first (Triton ones run under the interpreter on the CPU)
MORE_CORRECT: dict[str, tuple[str, ...]] = {"softmax": ("triton_online",)}
# known-bad examples of a canary site (tests/worker/test_canary_sites_stage.py), which this module's inputs do not target
CANARY_BAD: dict[str, tuple[str, ...]] = {
    "log_softmax": ("pytorch_bf16_chunk_sum",),
    "layernorm_forward": ("pytorch_bf16_sum_of_squares",),
}
CORRECT_IDS = [(p, g) for p, (good, _) in NEW.items() for g in (good, *MORE_CORRECT.get(p, ()))]
RULE = Tolerance()  # the benchmark's rule: atol = rtol = 1e-2 on 99% of elements
# a known-bad output that passes the elementwise rule must still be this many times further
# from the reference (normwise) than the correct example's output on the targeted input
WORSE_FACTOR = 10.0


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# targeted inputs: one CPU-sized case per problem that exposes its known-bad example(s)


def _softmax(g: torch.Generator) -> dict[str, Any]:
    x = torch.randn(16, 1000, generator=g) * 4
    x[:, 7] = 100.0  # one large logit per row: exp overflows fp32 past ~88.7
    return {"input": bf16(x)}


def _log_softmax(g: torch.Generator) -> dict[str, Any]:
    x = torch.randn(16, 2048, generator=g)
    x[:, 3] = 120.0  # a confident row: the other probabilities underflow fp32
    return {"logits": bf16(x)}


def _layernorm(g: torch.Generator) -> dict[str, Any]:
    # rows with a large offset and a small spread (|mean| / std ~ 2500): 1000 with a few +-4 steps
    steps = torch.multinomial(torch.tensor([0.005, 0.99, 0.005]), 32 * 4096, replacement=True, generator=g)
    x = 1000.0 + 4.0 * (steps.float() - 1).reshape(32, 4096)
    return {"input": bf16(x), "weight": bf16(torch.ones(4096)), "bias": bf16(torch.zeros(4096)), "eps": 1e-5}


def _add_rmsnorm(g: torch.Generator) -> dict[str, Any]:
    h = 16384  # a long row, as in the largest models
    return {
        "input": bf16(torch.randn(8, h, generator=g)),
        "residual": bf16(torch.randn(8, h, generator=g)),
        "weight": bf16(torch.ones(h)),
        "eps": 1e-6,
    }


def _rope(g: torch.Generator) -> dict[str, Any]:
    n = 64  # positions near the end of a 1M-token context
    return {
        "query": bf16(torch.randn(n, 4, 128, generator=g)),
        "key": bf16(torch.randn(n, 2, 128, generator=g)),
        "positions": torch.randint(900_000, 1_000_000, (n,), generator=g),
        "rope_theta": 1_000_000.0,
    }


def _glu(spike: float) -> Callable[[torch.Generator], dict[str, Any]]:
    def make(g: torch.Generator) -> dict[str, Any]:
        gate = torch.randn(16, 1024, generator=g)
        gate[:, 5] = spike  # a massive-activation channel
        return {"gate": bf16(gate), "up": bf16(torch.randn(16, 1024, generator=g))}

    return make


def _attention(g: torch.Generator) -> dict[str, Any]:
    shape = (1, 2, 2048, 64)  # 32 key blocks; values with a common offset
    return {
        "query": bf16(torch.randn(shape, generator=g)),
        "key": bf16(torch.randn(shape, generator=g)),
        "value": bf16(4.0 + torch.randn(shape, generator=g)),
    }


def _decode(g: torch.Generator) -> dict[str, Any]:
    b, s = 2, 4096  # long contexts, every slot valid; values with a common offset, so that P @ V only grows
    return {
        "q": bf16(torch.randn(b, 4, 32, generator=g)),
        "k_cache": bf16(torch.randn(b, s, 2, 32, generator=g)),
        "v_cache": bf16(4.0 + torch.randn(b, s, 2, 32, generator=g)),
        "kv_lens": torch.full((b,), s, dtype=torch.int32),
        "sm_scale": 32**-0.5,
    }


def _gemm(g: torch.Generator) -> dict[str, Any]:
    return {
        "input": bf16(torch.randn(64, 2048, generator=g)),
        "weight": bf16(torch.randn(256, 2048, generator=g)),
        "bias": bf16(torch.randn(256, generator=g)),
    }


def _moe(g: torch.Generator) -> dict[str, Any]:
    # coarsely quantised router logits: many exact ties, as a low-precision router gives
    logits = torch.round(torch.randn(256, 64, generator=g) * 4) / 4
    return {"router_logits": bf16(logits), "k": 6}


def _top_k(g: torch.Generator) -> dict[str, Any]:
    # logits from a bf16 LM head, upcast: ties at the k-th largest are common
    logits = bf16(torch.randn(16, 32000, generator=g) * 3).float()
    return {"logits": logits, "top_k": 50, "temperature": 0.7}


def _fp8(g: torch.Generator) -> dict[str, Any]:
    x = torch.randn(32, 512, generator=g)
    x[4] = 0.0  # a padding token's row
    return {"input": bf16(x)}


def _cumsum(g: torch.Generator) -> dict[str, Any]:
    return {"input": bf16(torch.rand(8, 8192, generator=g))}  # same-sign values (probabilities, counts)


def _segment_mean(g: torch.Generator) -> dict[str, Any]:
    ids = torch.arange(8).repeat_interleave(512)  # 8 sequences of 512 tokens, mean-pooled
    return {"values": bf16(0.5 + torch.randn(4096, 256, generator=g)), "segment_ids": ids, "num_segments": 8}


TARGETED: dict[str, Callable[[torch.Generator], dict[str, Any]]] = {
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layernorm_forward": _layernorm,
    "fused_add_rmsnorm": _add_rmsnorm,
    "rope": _rope,
    "swiglu": _glu(100.0),
    "geglu": _glu(20.0),
    "attention_forward": _attention,
    "attention_decode_gqa": _decode,
    "gemm_bias_gelu": _gemm,
    "moe_topk_routing": _moe,
    "top_k_renorm_probs": _top_k,
    "quantize_fp8_per_token": _fp8,
    "cumsum": _cumsum,
    "segment_mean": _segment_mean,
}


# var axes that no input's shape carries
EXTRA_AXES: dict[str, Callable[[dict[str, Any]], dict[str, int]]] = {
    "rope": lambda inputs: {"max_position": int(inputs["positions"].max()) + 1},
    "moe_topk_routing": lambda inputs: {"top_k": int(inputs["k"])},
    "segment_mean": lambda inputs: {"num_segments": int(inputs["num_segments"])},
}


def case_from(problem: Problem, inputs: dict[str, Any]) -> Case:
    """A Case for explicit inputs: the axes read back from the tensors' shapes."""
    defn = problem.definition
    axes: dict[str, int] = dict(EXTRA_AXES.get(problem.name, lambda _: {})(inputs))
    for name, spec in defn.inputs.items():
        for axis, size in zip(spec.shape or [], getattr(inputs[name], "shape", ())):
            assert axes.setdefault(axis, int(size)) == int(size), (name, axis)
    resolved = defn.resolve_axes(axes)
    return Case(
        axes=resolved, inputs=inputs, output_shapes={n: defn.shape_of(s, resolved) for n, s in defn.outputs.items()}
    )


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    return float((o - r).norm() / r.norm().clamp(min=1e-30))


# ---------------------------------------------------------------------------------------------
# the folders


def test_every_new_folder_is_complete_and_uncurated_except_the_listed_ones(catalogue: Catalogue) -> None:
    assert set(TARGETED) == set(NEW)
    assert set(NEW) >= CURATED and set(CURATED_AFTER_GENERIC) == CURATED  # the generic measurement strips exactly these
    for name, (good, bads) in NEW.items():
        p = catalogue.get(name)
        assert p.folder.name == name
        if name in CURATED:
            # audit.json validated on load (worker.problem_spec.AuditSpec); its oracle, budgets and probes are whole
            assert p.curated and p.has_oracle and (p.folder / "oracle.py").is_file(), name
            assert set(p.spec.budgets) == set(p.definition.outputs), name
            assert p.spec.probes and p.spec.order_free_axis in p.definition.var_axes, name
            for probe in p.spec.probes:
                case = build_probe_case(p.definition, probe, "cpu", seed=1)  # every generator and parameter is known
                assert set(case.inputs) == set(p.definition.inputs), (name, probe.name)
                p.definition.resolve_axes(probe.axes_for("gpu"))
        else:
            assert not p.curated, name
            assert not (p.folder / "audit.json").exists() and not (p.folder / "oracle.py").exists(), name
            assert p.spec.probes == [] and p.spec.budgets == {}, name  # nothing curated: the generic path's job
        assert p.workloads_gpu and p.workloads_cpu and p.workloads_cpu != p.workloads_gpu, name
        examples = p.example_solutions()
        assert {good, *bads, *MORE_CORRECT.get(name, ())} | set(CANARY_BAD.get(name, ())) == set(examples), name
        for sol_name, sol in examples.items():
            assert sol.definition == name and sol.spec.languages in (["pytorch"], ["triton"]), (name, sol_name)
        for bad in (*bads, *CANARY_BAD.get(name, ())):
            assert (name, bad) in KNOWN_BAD, f"benchmarks/expectations.py has no entry for {name}/{bad}"


def test_integer_inputs_say_what_they_index(catalogue: Catalogue) -> None:
    """Id-like tensor inputs carry a description naming them as ids/indices/positions, for the generic probes."""
    for name in NEW:
        for iname, spec in catalogue.get(name).definition.inputs.items():
            if spec.shape and not to_torch(spec.dtype).is_floating_point:
                desc = (spec.description or "").lower()
                assert any(w in desc for w in ("ids", "indices", "positions")), (name, iname)


@pytest.mark.parametrize("problem_name", list(NEW))
def test_reference_runs_on_every_cpu_workload(catalogue: Catalogue, problem_name: str) -> None:
    p = catalogue.get(problem_name)
    ref = Reference.of(p.definition)
    for w in p.workloads_cpu:
        case = build_case(p.definition, ref, w, seed=1, folder=p.folder)
        with torch.no_grad():
            outs = ref.run(case.args(p.definition))
        assert len(outs) == len(p.definition.outputs), w.uuid
        for (oname, spec), out in zip(p.definition.outputs.items(), outs):
            assert tuple(out.shape) == case.output_shapes[oname], (w.uuid, oname)
            assert out.dtype == to_torch(spec.dtype), (w.uuid, oname)
            assert bool(torch.isfinite(out.double()).all()), (w.uuid, oname)


@pytest.mark.parametrize(("problem_name", "good"), CORRECT_IDS)
def test_correct_example_passes_the_benchmark_rule(
    catalogue: Catalogue, pool: SandboxPool, problem_name: str, good: str
) -> None:
    p = catalogue.get(problem_name)
    ref = Reference.of(p.definition)
    case = build_case(p.definition, ref, p.workloads_cpu[0], seed=2, folder=p.folder)
    with torch.no_grad():
        expected = ref.run(case.args(p.definition))
    outs = call(pool.get(p, good), p, case)
    for (oname, spec), out, r in zip(p.definition.outputs.items(), outs, expected):
        c = compare_output(oname, out, r, to_torch(spec.dtype), RULE)
        assert c.ok, c.reason


@pytest.mark.parametrize(("problem_name", "bad"), BAD_IDS)
def test_known_bad_example_fails_where_the_correct_one_holds(
    catalogue: Catalogue, pool: SandboxPool, problem_name: str, bad: str
) -> None:
    p = catalogue.get(problem_name)
    case = case_from(p, TARGETED[problem_name](gen(3)))
    with torch.no_grad():
        expected = Reference.of(p.definition).run(case.args(p.definition))
    good_outs = call(pool.get(p, NEW[problem_name][0]), p, case)
    bad_outs = call(pool.get(p, bad), p, case)
    bad_fails_rule = False
    worse = False
    for (oname, spec), g, b, r in zip(p.definition.outputs.items(), good_outs, bad_outs, expected):
        dtype = to_torch(spec.dtype)
        good_c = compare_output(oname, g, r, dtype, RULE)
        assert good_c.ok, f"correct example on the targeted input: {good_c.reason}"
        bad_fails_rule |= not compare_output(oname, b, r, dtype, RULE).ok
        worse |= rel_error(b, r) > WORSE_FACTOR * max(rel_error(g, r), 1e-4)
    assert bad_fails_rule or worse, f"{problem_name}/{bad} is indistinguishable from the correct example"
