"""Gradient fidelity: the kernel on the op's real arguments along the reference's own SGD trajectory, against fp64.

The arguments are captured where the reference run meets the op (real batches, real weights at the profile's
fidelity steps), so the check sees the distributions training produces; each call's error per bucket of rows is
judged against the ideal output's (worker.canary.judge.fidelity).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from worker.canary import judge
from worker.canary.binding import Kernel, OpBinding
from worker.canary.train import State, capture_op_args
from worker.context import AuditContext
from worker.numerics.placement import on_device_or_cpu
from worker.problem_spec import OutputBudget
from worker.sandbox.protocol import CallRequest, output_specs
from worker.stages.canary.plan import Plan
from worker.watched_sandbox import WatchedSandbox

Oracle = Callable[..., Any]


def gradient_fidelity(
    ctx: AuditContext, plan: Plan, sandbox: WatchedSandbox, sgd_states: dict[int, State]
) -> list[judge.BucketFidelity]:
    """Per fidelity step that has weights (the init, or the reference SGD run's `sgd_states`), per captured call,
    per output and bucket of rows."""
    p = plan.profile
    ctx.progress("canary: gradient fidelity")
    t = time.perf_counter()
    fid: list[judge.BucketFidelity] = []
    oracle = ctx.problem.oracle(ctx.reference)
    budgets = ctx.problem.spec.budgets
    state_at = {0: plan.init, **sgd_states}
    for fstep in p.fidelity_steps:
        state = state_at.get(fstep)
        if state is None:
            continue
        seq = plan.batches[min(fstep, p.steps - 1)]
        for args in capture_op_args(p, plan.binding, plan.ref, state, seq, plan.device, p.fidelity_calls_per_step):
            fid.extend(_one_call(plan, sandbox, oracle, budgets, fstep, args))
    plan.timings["fidelity_s"] = round(time.perf_counter() - t, 2)
    return fid


def max_ratios(budgets: dict[str, OutputBudget], binding: OpBinding) -> dict[str, float]:
    """Per output the budget: how many times the ideal output's fp64 error the kernel's may be."""
    return {s.name: (budgets[s.name].max_ratio if s.name in budgets else 4.0) for s in binding.outputs}


def _one_call(
    plan: Plan, sandbox: WatchedSandbox, oracle: Oracle, budgets: dict[str, OutputBudget], step: int, args: list[Any]
) -> list[judge.BucketFidelity]:
    binding = plan.binding
    specs = _specs_for(binding, args, plan.ref, plan.device)
    outs = sandbox.send(CallRequest(args=args, outputs=output_specs(specs))).outputs
    exact = _exact(oracle, args, plan.device)
    exact = list(exact) if isinstance(exact, (tuple, list)) else [exact]
    fid: list[judge.BucketFidelity] = []
    for spec, o, e in zip(binding.outputs, outs, exact):
        budget = budgets.get(spec.name)
        fid.extend(judge.fidelity(step, spec.name, o, e, budget, _contributions(binding, args, budget, o)))
    return fid


def _contributions(
    binding: OpBinding, args: list[Any], budget: OutputBudget | None, out: torch.Tensor
) -> torch.Tensor | None:
    """Per row of `out`, how many index entries name it, where the budget buckets rows by that."""
    if budget is None or budget.bucket_by is None or budget.bucket_by.kind != "index_count":
        return None
    idx = dict(zip([s.name for s in binding.inputs], args)).get(budget.bucket_by.input or "")
    return torch.bincount(idx.reshape(-1).long(), minlength=out.shape[0]) if isinstance(idx, torch.Tensor) else None


def _specs_for(binding: OpBinding, args: list[Any], ref: Kernel, device: str) -> list[dict[str, Any]]:
    """Output shapes for a direct call: the reference's outputs on the same arguments give them."""
    outs = ref(
        [a.to(device) if isinstance(a, torch.Tensor) else a for a in args],
        [{"dtype": s.dtype} for s in binding.outputs],
    )
    return [{"shape": list(o.shape), "dtype": s.dtype} for o, s in zip(outs, binding.outputs)]


def _exact(oracle: Oracle, args: list[Any], device: str) -> Any:
    """The fp64 oracle on the audit's device (a loss site's logits are 134M elements), or on the CPU where the
    device has no room for it (a GPU shared by several audits)."""
    return on_device_or_cpu(device, lambda d: oracle(*[a.to(d) if isinstance(a, torch.Tensor) else a for a in args]))
