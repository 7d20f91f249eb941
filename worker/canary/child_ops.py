"""Served in the submission's child process (op "canary_train"): train with the submission at the site.

Nothing here decides a verdict: the parent evaluates the weights sent back on held-out text
with its own code; the loss curve sent back is kept as evidence only.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.canary import checkpoint_wire
from worker.canary.binding import Kernel, OpBinding
from worker.canary.profiles import CanaryProfile
from worker.canary.stacked import train_stacked
from worker.sandbox.harness import HarnessState, alloc_outputs, invoke


def submission_kernel(state: HarnessState) -> Kernel:
    """The loaded entry point as a Kernel: destination-passing or value-returning, per the solution."""
    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        dev_args = [a.to(state.device) if isinstance(a, torch.Tensor) else a for a in args]
        outs = alloc_outputs(state, specs, None)
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


def train(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    """One run per optimiser in `optimizers`, all with the submission at the site, trained together
    (worker.canary.stacked); `runs` holds each one's losses, in that order, and `outputs` their checkpoint weights
    as one tensor (worker.canary.checkpoint_wire)."""
    if payload.get("threads"):
        torch.set_num_threads(int(payload["threads"]))
    p = CanaryProfile.model_validate(payload["profile"])
    binding = OpBinding.model_validate(payload["binding"])
    opts = [str(o) for o in payload["optimizers"]]
    if not opts or any(o not in ("sgd", "adamw") for o in opts):
        raise ValueError(f"unknown optimisers {opts}")
    torch.manual_seed(int(payload["seed"]))
    kernel = submission_kernel(state)
    steps = sorted({int(s) for s in payload["checkpoints"]})
    # weights stay on the device where the reply's outputs are exported there (worker.sandbox.device_share)
    on_device = state.exporter is not None and torch.device(state.device).type == "cuda"
    first: dict[str, float] = {}
    outs = train_stacked(p, binding, [kernel] * len(opts), payload["init"], payload["batches"], opts,  # type: ignore[arg-type]
                         state.device, tuple(steps), keep_on_device=on_device, timings=first)
    runs = [{"optimizer": opt, "losses": out.losses, "checkpoint_steps": sorted(out.checkpoints)} for opt, out in zip(opts, outs)]
    weights = checkpoint_wire.pack([out.checkpoints for out in outs], steps, payload["init"],
                                   torch.device(state.device) if on_device else torch.device("cpu"))
    return {"ok": True, "runs": runs, "outputs": [weights], "first_step_s": first.get("first_step_s")}
