"""Several training runs of the canary's model at once: weights stacked on a leading member axis [K, ...].

Every member starts from the same weights and sees the same batches; only the kernel at the site
differs (the reference, its reruns, the reference moved by one ulp). The trusted parts of the model
run once for all members (batched matmuls, one attention call over K x batch), the op at the site is
called once per member, and each member keeps its own arithmetic: its own loss, its own gradient
clipping, elementwise optimiser updates. On the CPU a member's losses and weights equal those of
worker.canary.train.train for the same kernel (bit for bit at all four sites when measured with torch 2.13;
tests/worker/test_canary_stacked.py allows 1e-6); on a GPU, batched and single matmuls may round
differently, which is noise of the kind the null runs measure.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from worker.canary.binding import Kernel, OpBinding
from worker.canary.model import Ops, build, rmsnorm
from worker.canary.profiles import CanaryProfile, Optimizer
from worker.canary.sites import KernelOps
from worker.canary.train import State, TrainOutput, make_optimizer

Params = dict[str, torch.nn.Parameter]


class CanaryStopped(RuntimeError):
    """The stage that started this training is unwinding; the result would not be used."""


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [K, ..., in] times w [K, out, in] transposed, per member (one batched matmul)."""
    k = x.shape[0]
    y = torch.matmul(x.reshape(k, -1, x.shape[-1]), w.transpose(1, 2))
    return y.reshape(*x.shape[:-1], w.shape[1])


class StackedDecoder:
    """worker.canary.model.TinyDecoder with K members; `ops[k]` is member k's ops (site kernel or trusted)."""

    def __init__(self, p: CanaryProfile, binding: OpBinding, ops: Sequence[Ops], params: Params) -> None:
        self.p, self.site, self.ops, self.P = p, binding.site, list(ops), params
        self.k = len(self.ops)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.site == "norm":  # the kernel's op: one call per member
            return torch.stack([o.norm(xk, wk, self.p.norm_eps) for o, xk, wk in zip(self.ops, x.unbind(0), w.unbind(0))])
        return rmsnorm(x, w[:, None, None, :], self.p.norm_eps)

    def _block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        P, pre = self.P, f"blocks.{i}."
        k, b, t, d = h.shape
        heads = self.p.n_heads
        q, kk, v = _linear(self._norm(h, P[pre + "norm1"]), P[pre + "qkv.weight"]).split(d, dim=-1)
        q, kk, v = (z.reshape(k * b, t, heads, d // heads).transpose(1, 2) for z in (q, kk, v))
        a = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        h = h + _linear(a.transpose(1, 2).reshape(k, b, t, d), P[pre + "proj.weight"])
        return h + _linear(F.gelu(_linear(self._norm(h, P[pre + "norm2"]), P[pre + "fc1.weight"])), P[pre + "fc2.weight"])

    def losses(self, seq: torch.Tensor) -> torch.Tensor:
        """seq: [batch, T+1] token ids, the same for every member; [K] next-token losses."""
        ids, targets = seq[:, :-1], seq[:, 1:]
        P, eps = self.P, self.p.norm_eps
        tables = P["tok_emb"].unbind(0)
        if self.site == "embedding_norm":
            ws = P["emb_norm"].unbind(0)
            h = torch.stack([o.embed_norm(ids, tb, w, eps) for o, tb, w in zip(self.ops, tables, ws)])
        else:
            h = torch.stack([o.embed(ids, tb) for o, tb in zip(self.ops, tables)])
        for i in range(self.p.n_layers):
            h = self._block(i, h)
        logits = _linear(self._norm(h, P["final_norm"]), P["head.weight"])
        flat = targets.reshape(-1)
        return torch.stack([o.loss(lg.reshape(-1, lg.shape[-1]), flat) for o, lg in zip(self.ops, logits.unbind(0))])


def stack_params(p: CanaryProfile, binding: OpBinding, init: State, k: int, device: torch.device) -> Params:
    """K copies of `init`, in the single model's parameter order (which gradient clipping sums in)."""
    single = build(p, binding.site, init, "cpu")  # validates names and shapes
    return {
        name: torch.nn.Parameter(torch.stack([t.detach().float()] * k).to(device).contiguous())
        for name, t in single.named_parameters()
    }


def clip_per_member(params: Sequence[torch.Tensor], max_norm: float, k: int) -> None:
    """torch.nn.utils.clip_grad_norm_ applied to each member's gradients separately."""
    grads = [q.grad for q in params if q.grad is not None]
    if not grads:
        return
    totals = torch.stack([
        torch.linalg.vector_norm(torch.stack(torch._foreach_norm([g[m] for g in grads], 2.0)), 2.0) for m in range(k)
    ])
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
    opts = [opt] * k if isinstance(opt, str) else list(opt)
    if len(opts) != k:
        raise ValueError(f"{k} kernels but {len(opts)} optimisers")
    groups = _groups(opts)
    order = [m for _, members in groups for m in members]  # stacked position -> member
    group_params = [stack_params(p, binding, init, len(members), device) for _, members in groups]
    optims = [make_optimizer(p, o, list(gp.values())) for (o, _), gp in zip(groups, group_params)]
    ops = [KernelOps(binding, kernels[m]) for m in order]

    def joined() -> Params:
        if len(group_params) == 1:
            return group_params[0]
        return {name: torch.cat([gp[name] for gp in group_params]) for name in group_params[0]}  # type: ignore[misc]

    def member_state(m: int) -> State:
        for (_, members), gp in zip(groups, group_params):
            if m in members:
                return _member_state(gp, members.index(m), keep_on_device)
        raise KeyError(m)

    keep = set(checkpoints if checkpoints is not None else p.checkpoints)
    outs = [TrainOutput(losses=[]) for _ in range(k)]
    live = list(range(k))  # members not yet diverged
    pending: list[torch.Tensor] = []
    steps = int(batches.shape[0])
    started = time.perf_counter()
    for step in range(steps):
        if stop is not None and stop.is_set():
            raise CanaryStopped(f"stopped at step {step} of {steps}")
        if widen is not None and widen[0].is_set() and torch.get_num_threads() < widen[1]:
            torch.set_num_threads(widen[1])  # OpenMP's count is per thread: set here, in the training thread
        seq = batches[step].to(device=device, dtype=torch.long)
        model = StackedDecoder(p, binding, ops, joined())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=p.autocast_bf16 and device.type == "cuda"):
            losses = model.losses(seq)
        for o in optims:
            o.zero_grad(set_to_none=True)
        losses.sum().backward()  # members share no weights: each gets exactly its own loss's gradient
        if p.grad_clip > 0:
            for (_, members), gp in zip(groups, group_params):
                clip_per_member(list(gp.values()), p.grad_clip, len(members))
        for o in optims:
            o.step()
        pending.append(losses.detach().float())
        if step == 0 and timings is not None:
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            timings["first_step_s"] = round(time.perf_counter() - started, 3)
        if step + 1 in keep:
            for m in live:
                outs[m].checkpoints[step + 1] = member_state(m)
        if step + 1 in keep or (step + 1) % 25 == 0 or step + 1 == steps:
            history = torch.stack(pending).cpu()
            pending.clear()
            for m in list(live):
                outs[m].losses.extend(history[:, order.index(m)].tolist())
                if not math.isfinite(outs[m].losses[-1]):  # diverged: every later checkpoint is these weights
                    snap = member_state(m)
                    for s in keep:
                        if s > step + 1:
                            outs[m].checkpoints[s] = snap
                    live.remove(m)
            if not live:
                break
    return outs


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
