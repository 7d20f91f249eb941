"""One training run, the same code in the trusted parent and in the submission's child."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.canary.binding import Kernel, OpBinding
from worker.canary.model import Ops, build
from worker.canary.profiles import CanaryProfile, Optimizer
from worker.canary.sites import KernelOps

State = dict[str, torch.Tensor]


@dataclass
class TrainOutput:
    losses: list[float]
    checkpoints: dict[int, State] = field(default_factory=dict)


def make_optimizer(p: CanaryProfile, opt: Optimizer, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if opt == "sgd":
        return torch.optim.SGD(params, lr=p.sgd_lr, momentum=p.sgd_momentum)
    return torch.optim.AdamW(params, lr=p.adamw_lr, weight_decay=p.adamw_weight_decay, betas=(0.9, 0.95))


def _snapshot(model: torch.nn.Module) -> State:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def train(
    p: CanaryProfile,
    binding: OpBinding,
    kernel: Kernel,
    init: State,
    batches: torch.Tensor,
    opt: Optimizer,
    device: torch.device | str,
    checkpoints: tuple[int, ...] | None = None,
    after_step: Callable[[int, torch.nn.Module], None] | None = None,
) -> TrainOutput:
    """Train from `init` on `batches` ([steps, B, T+1]); keep the weights after each checkpoint step."""
    device = torch.device(device)
    model = build(p, binding, init, device)
    ops = KernelOps(binding, kernel)
    optim = make_optimizer(p, opt, list(model.parameters()))
    keep = set(checkpoints if checkpoints is not None else p.checkpoints)
    out = TrainOutput(losses=[])
    pending: list[torch.Tensor] = []  # losses stay on the device until a sync point: no per-step sync
    steps = int(batches.shape[0])
    for step in range(steps):
        seq = batches[step].to(device=device, dtype=torch.long)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=p.autocast_bf16 and device.type == "cuda"):
            loss = model.loss(seq, ops)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        if p.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip)
        optim.step()
        pending.append(loss.detach().float())
        if after_step is not None:
            after_step(step + 1, model)
        if step + 1 in keep:
            out.checkpoints[step + 1] = _snapshot(model)
        if step + 1 in keep or (step + 1) % 25 == 0 or step + 1 == steps:
            out.losses.extend(torch.stack(pending).cpu().tolist())
            pending.clear()
            if not math.isfinite(out.losses[-1]):  # diverged: every later checkpoint is these (non-finite) weights
                snap = _snapshot(model)
                for s in keep:
                    if s > step + 1:
                        out.checkpoints[s] = snap
                break
    return out


@torch.no_grad()
def heldout_loss(
    p: CanaryProfile,
    site: OpBinding | str,
    state: State,
    heldout: torch.Tensor,
    device: torch.device | str,
    chunk: int = 32,
) -> float:
    """Trusted evaluation: plain PyTorch ops in fp32, mean next-token loss over the held-out windows. `site`: the
    binding (or an original site's name), which says which variant of the model the weights are for."""
    model = build(p, site, state, device)  # type: ignore[arg-type]
    # finiteness checked on the model's device in one sync (per tensor on the host it cost 7.5 s of a GPU canary)
    if not bool(torch.stack([torch.isfinite(t).all() for t in model.parameters()]).all()):
        return math.inf
    ops = Ops()
    total, n = 0.0, 0
    for i in range(0, heldout.shape[0], chunk):
        seq = heldout[i : i + chunk].to(device=device, dtype=torch.long)
        loss = model.loss(seq, ops)
        total += float(loss) * seq.shape[0]
        n += seq.shape[0]
    value = total / n
    return value if math.isfinite(value) else math.inf


# kernels the trusted side runs ---------------------------------------------------------------


def reference_kernel(run: Callable[..., Any]) -> Kernel:
    """The definition's reference (value-returning) as a Kernel, outputs cast to the declared dtypes."""

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        out = run(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.to(getattr(torch, s["dtype"])) for o, s in zip(outs, specs)]

    return k


_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}
# the exponent field of each dtype's bits: all ones is an infinity or a NaN
_EXPONENT = {
    torch.bfloat16: 0x7F80,
    torch.float16: 0x7C00,
    torch.float32: 0x7F800000,
    torch.float64: 0x7FF0000000000000,
}
_MAGNITUDE = {torch.int16: 0x7FFF, torch.int32: 0x7FFFFFFF, torch.int64: 0x7FFFFFFFFFFFFFFF}


def perturb_ulp(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Move a random half of the elements by one unit in the last place of t's dtype (magnitude up or down: each
    element up with probability 1/4, down with 1/4 unless it is zero, infinities and NaNs never).

    Integer arithmetic on the bits, with two random bits per element taken four to a random byte: drawn one per
    element and tested with float compares, this cost about 40 ms for the 4M-element logits gradient of the CPU
    canary's loss site, once per step and null run (5 s of its parent's 30 s)."""
    if t.dtype not in _INT_VIEW:
        return t
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).reshape(-1)
    n = bits.numel()
    byte = torch.empty((n + 3) // 4, dtype=torch.uint8, device=t.device).random_(generator=gen)
    r = torch.cat([(byte >> s) & 3 for s in (0, 2, 4, 6)])[:n]
    exponent = _EXPONENT[t.dtype]
    finite = (bits & exponent) != exponent
    up = (r == 1) & finite
    down = (r == 2) & finite & ((bits & _MAGNITUDE[bits.dtype]) != 0)
    moved = bits + up.to(bits.dtype) - down.to(bits.dtype)
    return moved.view(t.dtype).reshape(t.shape)


def perturbed_kernel(inner: Kernel, seed: int, device: torch.device | str) -> Kernel:
    """The null model of 'differs only by rounding': inner's outputs moved by 1 ulp on half the elements."""
    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        return [perturb_ulp(o, gen) for o in inner(args, specs)]

    return k


@dataclass
class Captured:
    calls: list[list[Any]] = field(default_factory=list)


def capturing_kernel(inner: Kernel, sink: Captured, limit: int) -> Kernel:
    """Records (a CPU copy of) the op's arguments as the model produces them, then runs inner."""

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        if len(sink.calls) < limit:
            sink.calls.append([a.detach().to("cpu", copy=True) if isinstance(a, torch.Tensor) else a for a in args])
        return inner(args, specs)

    return k


def capture_op_args(
    p: CanaryProfile,
    binding: OpBinding,
    ref: Kernel,
    state: State,
    seq: torch.Tensor,
    device: torch.device | str,
    limit: int,
) -> list[list[Any]]:
    """The op's real arguments at these weights on this batch (forward and backward of one step)."""
    device = torch.device(device)
    model = build(p, binding, state, device)
    sink = Captured()
    ops = KernelOps(binding, capturing_kernel(ref, sink, limit))
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=p.autocast_bf16 and device.type == "cuda"):
        loss = model.loss(seq.to(device=device, dtype=torch.long), ops)
    loss.backward()
    return sink.calls
