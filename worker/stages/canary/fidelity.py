"""Gradient fidelity: the kernel on the op's real arguments along the reference's own SGD trajectory, against fp64.

The arguments are captured where the reference run meets the op (real batches, real weights at the profile's
fidelity steps), so the check sees the distributions training produces; each call's error per bucket of rows is
judged against the ideal output's (worker.canary.judge.fidelity). On the generic path, a call over its budget there
is judged again against what honest implementations make on the same arguments (worker.stages.honest_runs): an fp32
kernel that sums in another order than the reference is honest, and no nearer the ideal output than they are.

Where the op's reduction spans the sequence (attention), its error grows with the context, and the canary trains at
a short one; so the trained weights also run one longer window of the training text (CanaryProfile.fidelity_context)
and the op is judged on those arguments too, where the definition lets that axis vary.
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
from worker.formats import Definition
from worker.generic.promote import GenericOracle
from worker.numerics.placement import on_device_or_cpu
from worker.problem_spec import OutputBudget
from worker.sandbox.protocol import CallRequest, output_specs
from worker.stages.honest_runs import honest_runs
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
    state_at = {0: plan.init, **sgd_states}
    short: list[Any] = []
    for fstep in p.fidelity_steps:
        state = state_at.get(fstep)
        if state is None:
            continue
        seq = plan.batches[min(fstep, p.steps - 1)]
        for args in capture_op_args(p, plan.binding, plan.ref, state, seq, plan.device, p.fidelity_calls_per_step):
            fid.extend(_one_call(ctx, plan, sandbox, oracle, fstep, args))
            short = args
    plan.timings["fidelity_s"] = round(time.perf_counter() - t, 2)
    fid += _long_context(ctx, plan, sandbox, oracle, state_at, short)
    return fid


LONG_CONTEXT_SITES = frozenset({"attention"})  # sites whose op reduces over the whole sequence


def _long_context(
    ctx: AuditContext,
    plan: Plan,
    sandbox: WatchedSandbox,
    oracle: Oracle,
    state_at: dict[int, State],
    short: list[Any],
) -> list[judge.BucketFidelity]:
    """The op on one CanaryProfile.fidelity_context-token window at the last fidelity step's weights."""
    window = plan.text.long_window
    if window is None or plan.binding.site not in LONG_CONTEXT_SITES or not short:
        return []
    t = time.perf_counter()
    ctx.progress(f"canary: gradient fidelity on a window of {window.shape[-1] - 1} tokens")
    step = max(s for s in plan.profile.fidelity_steps if s in state_at)
    calls = capture_op_args(
        plan.profile, plan.binding, plan.ref, state_at[step], window, plan.device, plan.profile.fidelity_calls_per_step
    )
    fid: list[judge.BucketFidelity] = []
    for args in calls:
        if not only_var_axes_moved(ctx.problem.definition, plan.binding, short, args):
            plan.long_context = "not checked: the definition fixes an axis that the sequence length sets"
            return []
        context = window.shape[-1] - 1
        fid += [f.model_copy(update={"context": context}) for f in _one_call(ctx, plan, sandbox, oracle, step, args)]
    plan.timings["fidelity_long_context_s"] = round(time.perf_counter() - t, 2)
    plan.long_context = f"checked on one window of {window.shape[-1] - 1} tokens of the training text at step {step}"
    return fid


def only_var_axes_moved(d: Definition, binding: OpBinding, short: list[Any], long: list[Any]) -> bool:
    """Whether every size the longer window changed is of an axis the definition lets vary (not const or derived)."""
    for spec, a, b in zip(binding.inputs, short, long):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        names = d.inputs[spec.name].shape or []
        if len(names) != b.dim():
            return False
        if any(x != y and d.axes[n].type != "var" for n, x, y in zip(names, a.shape, b.shape)):
            return False
    return True


def max_ratios(budgets: dict[str, OutputBudget], binding: OpBinding) -> dict[str, float]:
    """Per output the budget: how many times the ideal output's fp64 error the kernel's may be."""
    return {s.name: (budgets[s.name].max_ratio if s.name in budgets else 4.0) for s in binding.outputs}


def _one_call(
    ctx: AuditContext, plan: Plan, sandbox: WatchedSandbox, oracle: Oracle, step: int, args: list[Any]
) -> list[judge.BucketFidelity]:
    binding = plan.binding
    budgets = ctx.problem.spec.budgets
    specs = _specs_for(binding, args, plan.ref, plan.device)
    outs = sandbox.send(CallRequest(args=args, outputs=output_specs(specs))).outputs
    exact = _exact(oracle, args, plan.device)
    exact = list(exact) if isinstance(exact, (tuple, list)) else [exact]

    def judged(honest: dict[str, list[torch.Tensor]]) -> list[judge.BucketFidelity]:
        fid: list[judge.BucketFidelity] = []
        for i, (spec, o, e) in enumerate(zip(binding.outputs, outs, exact)):
            budget = budgets.get(spec.name)
            yardsticks = [run[i] for run in honest.values() if i < len(run)]
            counts = _contributions(binding, args, budget, o)
            fid.extend(judge.fidelity(step, spec.name, o, e, budget, counts, yardsticks or None))
        return fid

    fid = judged({})
    limits = max_ratios(budgets, binding)
    over = any(f.ratio > limits[f.output] for f in fid)
    # the honest implementations cost three reference runs, and can only lower a ratio: run them where one is over
    if over and isinstance(oracle, GenericOracle) and oracle.last_promoted:
        fid = judged(honest_runs(ctx, args))
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
