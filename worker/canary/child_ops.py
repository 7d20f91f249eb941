"""The canary's ops, served in the submission's child process (worker.sandbox.registry.OP_MODULES lists this module):
"canary_train" trains with the submission at the site; "warm" runs a few trusted training steps before any submission
is loaded (worker.canary.warm). The request and reply models of "canary_train" live here, with its handler.

Nothing here decides a verdict: the parent evaluates the weights sent back on held-out text
with its own code; the loss curve sent back is kept as evidence only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field, field_serializer

from worker.canary import checkpoint_wire
from worker.canary.binding import Kernel, OpBinding
from worker.canary.profiles import CanaryProfile, Optimizer
from worker.canary.stacked import train_stacked
from worker.numerics import gpu_memory
from worker.sandbox.harness import HarnessState, alloc_outputs, invoke
from worker.sandbox.protocol import PlainTensor, Reply, Request, WarmReply, WarmRequest, output_specs
from worker.sandbox.registry import op


class TrainedRun(Reply):
    """The child's own record of one run (evidence only: the parent judges the weights, never these losses)."""

    optimizer: str
    losses: list[float]
    checkpoint_steps: list[int]


class CanaryTrainReply(Reply):
    runs: list[TrainedRun]  # one per optimiser of the request, in its order
    outputs: list[PlainTensor]  # every run's checkpoint weights, in pieces (worker.canary.checkpoint_wire)
    first_step_s: float | None = None  # the child's own clock: evidence only


class CanaryTrainRequest(Request[CanaryTrainReply]):
    """One run per optimiser of `optimizers`, all with the submission at the site, from `init` over `batches`
    (the parent's plan, worker.stages.canary.plan), seeded with `seed`; weights kept at `checkpoints`."""

    op: ClassVar[str] = "canary_train"
    profile: CanaryProfile
    binding: OpBinding
    init: dict[str, torch.Tensor]
    batches: torch.Tensor
    optimizers: list[Optimizer] = Field(min_length=1)
    checkpoints: list[int]
    seed: int
    threads: int = Field(0, ge=0)  # the child's intra-op threads; 0 leaves torch's default

    @field_serializer("profile", "binding")
    def _json(self, value: CanaryProfile | OpBinding) -> dict[str, Any]:
        # the frame is read weights-only: plain containers, not the models' own types
        return value.model_dump(mode="json")


def submission_kernel(state: HarnessState) -> Kernel:
    """The loaded entry point as a Kernel: destination-passing or value-returning, per the solution."""

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        dev_args = [a.to(state.device) if isinstance(a, torch.Tensor) else a for a in args]
        outs = alloc_outputs(state, output_specs(specs), None)
        results = invoke(state, dev_args, outs)
        if len(results) != len(specs):
            raise ValueError(f"the kernel returned {len(results)} output(s), expected {len(specs)}")
        plain = []
        for r, s in zip(results, specs):
            if not isinstance(r, torch.Tensor):
                raise TypeError(f"the kernel returned a {type(r).__name__}, not a tensor")
            r = torch.Tensor.as_subclass(r.detach(), torch.Tensor).clone()
            if list(r.shape) != list(s["shape"]) or r.dtype != getattr(torch, s["dtype"]):
                raise ValueError(f"the kernel returned {r.dtype} {list(r.shape)}, expected {s['dtype']} {s['shape']}")
            plain.append(r)
        return plain

    return k


@op(CanaryTrainRequest)
def train(state: HarnessState, request: CanaryTrainRequest) -> CanaryTrainReply:
    """One run per optimiser, trained together (worker.canary.stacked); `runs` holds each one's losses, in that
    order, and `outputs` their checkpoint weights in pieces (worker.canary.checkpoint_wire)."""
    if request.threads:
        torch.set_num_threads(request.threads)
    opts = list(request.optimizers)
    torch.manual_seed(request.seed)
    kernel = submission_kernel(state)
    steps = sorted(set(request.checkpoints))
    # weights stay on the device where the reply's outputs are exported there (worker.sandbox.device_share)
    on_device = state.exporter is not None and torch.device(state.device).type == "cuda"
    first: dict[str, float] = {}
    outs = train_stacked(
        request.profile,
        request.binding,
        [kernel] * len(opts),
        request.init,
        request.batches,
        opts,
        state.device,
        tuple(steps),
        keep_on_device=on_device,
        timings=first,
    )
    # the training's freed blocks go back to the card before the weights are packed and exported: the export's
    # memory (cuMemCreate, worker.sandbox.device_share) comes from the driver, not from this process's cache
    gpu_memory.release(str(state.device))
    runs = [
        TrainedRun(optimizer=opt, losses=out.losses, checkpoint_steps=sorted(out.checkpoints))
        for opt, out in zip(opts, outs)
    ]
    weights = checkpoint_wire.pack(
        [out.checkpoints for out in outs],
        steps,
        request.init,
        torch.device(state.device) if on_device else torch.device("cpu"),
        request.profile.wire_piece_elements,
    )
    return CanaryTrainReply(runs=runs, outputs=weights, first_step_s=first.get("first_step_s"))


@op(WarmRequest)
def warm(state: HarnessState, request: WarmRequest) -> WarmReply:
    """Before any submission is loaded (the parent refuses it afterwards): worker.canary.warm."""
    if state.fn is not None:
        raise RuntimeError("warm-up runs only before a submission is loaded")
    from worker.canary.warm import warm_up

    return WarmReply(seconds=warm_up(state.device, request.steps))
