"""Several training runs of the canary's model at once: weights stacked on a leading member axis [K, ...].

Every member starts from the same weights and sees the same batches; only the kernel at the site
differs (the reference, its reruns, the reference moved by one ulp). The model's arithmetic is
worker.canary.forward's: the trusted parts run once for all members (batched matmuls, one attention call over
K x batch), the op at the site is called once per member, and each member keeps its own arithmetic: its own loss,
its own gradient clipping, elementwise optimiser updates. On the CPU a member's losses and weights equal those of
worker.canary.train.train for the same kernel (tests/worker/test_canary_stacked.py allows 1e-6); on a GPU,
batched and single matmuls may round differently, which is noise of the kind the null runs measure.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from worker.canary.arch import arch_of
from worker.canary.binding import Kernel, OpBinding
from worker.canary.forward import Decoder
from worker.canary.model import build
from worker.canary.profiles import CanaryProfile, Optimizer
from worker.canary.sites import KernelOps
from worker.canary.train import State, TrainOutput, make_optimizer

Params = dict[str, torch.nn.Parameter]


class CanaryStopped(RuntimeError):
    """The stage that started this training is unwinding; the result would not be used."""


def stack_params(p: CanaryProfile, binding: OpBinding, init: State, k: int, device: torch.device) -> Params:
    """K copies of `init`, in the single model's parameter order (which gradient clipping sums in)."""
    single = build(p, binding, init, "cpu")  # validates names and shapes
    return {
        name: torch.nn.Parameter(torch.stack([t.detach().float()] * k).to(device).contiguous())
        for name, t in single.named_parameters()
    }


def clip_per_member(params: Sequence[torch.Tensor], max_norm: float, k: int) -> None:
    """torch.nn.utils.clip_grad_norm_ applied to each member's gradients separately."""
    grads = [q.grad for q in params if q.grad is not None]
    if not grads:
        return
    totals = torch.stack(
        [torch.linalg.vector_norm(torch.stack(torch._foreach_norm([g[m] for g in grads], 2.0)), 2.0) for m in range(k)]
    )
    coef = torch.clamp(max_norm / (totals + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(k, *([1] * (g.dim() - 1))))


def _member_state(params: Params, m: int, on_device: bool) -> State:
    if on_device:
        return {name: t[m].detach().clone() for name, t in params.items()}
    return {name: t[m].detach().to("cpu", copy=True) for name, t in params.items()}


def _groups(opts: Sequence[Optimizer]) -> list[tuple[Optimizer, list[int]]]:
    """Members by optimiser, in first-seen order: [(optimiser, member indices)]."""
    out: dict[Optimizer, list[int]] = {}
    for m, o in enumerate(opts):
        out.setdefault(o, []).append(m)
    return list(out.items())


@dataclass
class _Stack:
    """The members' weights, stacked per optimiser (one tensor per parameter and optimiser), and the optimisers."""

    p: CanaryProfile
    groups: list[tuple[Optimizer, list[int]]]
    params: list[Params]
    optims: list[torch.optim.Optimizer]
    keep_on_device: bool

    @classmethod
    def of(
        cls,
        p: CanaryProfile,
        binding: OpBinding,
        init: State,
        opts: list[Optimizer],
        device: torch.device,
        keep_on_device: bool,
    ) -> _Stack:
        groups = _groups(opts)
        params = [stack_params(p, binding, init, len(members), device) for _, members in groups]
        optims = [make_optimizer(p, o, list(gp.values())) for (o, _), gp in zip(groups, params)]
        return cls(p, groups, params, optims, keep_on_device)

    @property
    def order(self) -> list[int]:
        """Stacked position -> member."""
        return [m for _, members in self.groups for m in members]

    def joined(self) -> Params:
        """Every member's weights in stacked order: what the model sees."""
        if len(self.params) == 1:
            return self.params[0]
        return {name: torch.cat([gp[name] for gp in self.params]) for name in self.params[0]}  # type: ignore[misc]

    def member_state(self, m: int) -> State:
        for (_, members), gp in zip(self.groups, self.params):
            if m in members:
                return _member_state(gp, members.index(m), self.keep_on_device)
        raise KeyError(m)

    def update(self, losses: torch.Tensor) -> None:
        """One optimiser step of every member, each from its own loss, clipped per member."""
        for o in self.optims:
            o.zero_grad(set_to_none=True)
        losses.sum().backward()  # members share no weights: each gets exactly its own loss's gradient
        if self.p.grad_clip > 0:
            for (_, members), gp in zip(self.groups, self.params):
                clip_per_member(list(gp.values()), self.p.grad_clip, len(members))
        for o in self.optims:
            o.step()


@dataclass
class _Runs:
    """Each member's losses and checkpoints so far; a member whose loss is no longer finite stops being recorded."""

    outs: list[TrainOutput]
    keep: set[int]
    live: list[int] = field(default_factory=list)
    pending: list[torch.Tensor] = field(default_factory=list)  # losses stay on the device until a sync point

    def checkpoint(self, step: int, stack: _Stack) -> None:
        for m in self.live:
            self.outs[m].checkpoints[step] = stack.member_state(m)

    def flush(self, step: int, stack: _Stack) -> None:
        history = torch.stack(self.pending).cpu()
        self.pending.clear()
        order = stack.order
        for m in list(self.live):
            self.outs[m].losses.extend(history[:, order.index(m)].tolist())
            if not math.isfinite(self.outs[m].losses[-1]):  # diverged: every later checkpoint is these weights
                snap = stack.member_state(m)
                for s in self.keep:
                    if s > step:
                        self.outs[m].checkpoints[s] = snap
                self.live.remove(m)


def _before_step(
    step: int, steps: int, stop: threading.Event | None, widen: tuple[threading.Event, int] | None
) -> None:
    if stop is not None and stop.is_set():
        raise CanaryStopped(f"stopped at step {step} of {steps}")
    if widen is not None and widen[0].is_set() and torch.get_num_threads() < widen[1]:
        torch.set_num_threads(widen[1])  # OpenMP's count is per thread: set here, in the training thread


def train_stacked(
    p: CanaryProfile,
    binding: OpBinding,
    kernels: Sequence[Kernel],
    init: State,
    batches: torch.Tensor,
    opt: Optimizer | Sequence[Optimizer],
    device: torch.device | str,
    checkpoints: tuple[int, ...] | None = None,
    stop: threading.Event | None = None,
    widen: tuple[threading.Event, int] | None = None,
    keep_on_device: bool = False,
    timings: dict[str, float] | None = None,
) -> list[TrainOutput]:
    """worker.canary.train.train for every kernel at once: one TrainOutput per kernel, in order.

    `opt` is one optimiser for every member, or one per member: members of one optimiser hold their weights
    in one stacked tensor per parameter, updated by one torch.optim optimiser; the model sees every member's
    weights concatenated, so the trusted layers still run once for all (SGD and AdamW runs in one pass: on a
    GPU a model this small is bound by kernel launches, not arithmetic).
    `stop`, once set, ends the training at the next step with CanaryStopped (its caller is unwinding).
    `widen` = (event, threads): once the event is set (the submission's process next to this one has finished
    training, freeing its cores), the rest of the training runs on that many intra-op threads.
    `keep_on_device`: checkpoint weights stay on the training's device (else they are copied to the host).
    `timings`, if given, gets "first_step_s": the first step's wall time, device work included (one synchronisation),
    which holds what a process pays on first use of the site's ops."""
    device = torch.device(device)
    k = len(kernels)
    if k == 0:
        return []
    opts: list[Optimizer] = [opt] * k if isinstance(opt, str) else list(opt)
    if len(opts) != k:
        raise ValueError(f"{k} kernels but {len(opts)} optimisers")
    stack = _Stack.of(p, binding, init, opts, device, keep_on_device)
    ops = [KernelOps(binding, kernels[m]) for m in stack.order]
    arch = arch_of(binding)
    runs = _Runs(
        outs=[TrainOutput(losses=[]) for _ in range(k)],
        keep=set(checkpoints if checkpoints is not None else p.checkpoints),
        live=list(range(k)),
    )
    steps = int(batches.shape[0])
    started = time.perf_counter()
    for step in range(steps):
        _before_step(step, steps, stop, widen)
        seq = batches[step].to(device=device, dtype=torch.long)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=p.autocast_bf16 and device.type == "cuda"):
            losses = Decoder(p, arch, ops, stack.joined()).losses(seq)
        stack.update(losses)
        runs.pending.append(losses.detach().float())
        if step == 0 and timings is not None:
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            timings["first_step_s"] = round(time.perf_counter() - started, 3)
        if step + 1 in runs.keep:
            runs.checkpoint(step + 1, stack)
        if step + 1 in runs.keep or (step + 1) % 25 == 0 or step + 1 == steps:
            runs.flush(step + 1, stack)
            if not runs.live:
                break
    return runs.outs


@contextmanager
def parent_thread(device: torch.device | str, threads: int | None) -> Iterator[None]:
    """Set up a thread that trains next to others: its own intra-op thread count (OpenMP's is per thread)
    and, on a GPU, its own CUDA stream, drained before the thread's results are used elsewhere."""
    if threads:
        torch.set_num_threads(threads)
    device = torch.device(device)
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()
