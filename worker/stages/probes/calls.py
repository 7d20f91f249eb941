"""Calling the kernel in its sandbox, and refusing outputs of the wrong number, shape or
dtype before any of them is measured."""

from __future__ import annotations

import torch

from worker.context import AuditContext
from worker.inputs import Case
from worker.numerics.dtypes import to_torch
from worker.sandbox import SandboxCrash, SandboxTimeout, SubmissionError
from worker.sandbox.protocol import CallReply, CallRequest, output_specs


class KernelOutputError(RuntimeError):
    """The kernel handed back outputs of the wrong number, shape or dtype."""


# a kernel's failure on one call: it fails that probe or check, not the whole stage
KERNEL_FAILURES = (SubmissionError, SandboxCrash, SandboxTimeout, KernelOutputError)


def positions(ctx: AuditContext, names: list[str]) -> list[int]:
    """The named inputs' positions among the definition's arguments."""
    order = list(ctx.problem.definition.inputs)
    return [order.index(n) for n in names]


def call_kernel(ctx: AuditContext, case: Case, poison: float, noncontiguous: list[int]) -> CallReply:
    """One call of the kernel on `case`: outputs pre-filled with `poison`, the inputs at
    `noncontiguous` handed over as strided views."""
    definition = ctx.problem.definition
    reply = ctx.sandbox().send(
        CallRequest(
            args=case.args(definition),
            outputs=output_specs(case.output_specs(definition)),
            poison=poison,
            noncontiguous=noncontiguous,
            # the inputs after the call come back as digests, not copies
            # (checks.check_inputs_unmodified compares digests)
            digest_after=True,
        )
    )
    _check_outputs(ctx, case, reply.outputs)
    return reply


def _check_outputs(ctx: AuditContext, case: Case, outs: list[torch.Tensor]) -> None:
    definition = ctx.problem.definition
    if len(outs) != len(definition.outputs):
        raise KernelOutputError(
            f"the kernel returned {len(outs)} outputs; the definition has {len(definition.outputs)}"
        )
    for (name, spec), t in zip(definition.outputs.items(), outs, strict=True):
        want_shape, want_dtype = case.output_shapes[name], to_torch(spec.dtype)
        if tuple(t.shape) != tuple(want_shape) or t.dtype != want_dtype:
            raise KernelOutputError(
                f"output '{name}' is {tuple(t.shape)} {t.dtype}; the definition says {tuple(want_shape)} {want_dtype}"
            )
