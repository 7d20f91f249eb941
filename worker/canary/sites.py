"""The model's ops with a kernel in place of the one at the problem's site.

The forward/backward around the kernel is trusted code; only the op itself is the kernel's.
A kernel takes (args in definition input order, output specs) and returns outputs in order.
The four original sites' autograd Functions are here; the newer ones are in worker.canary.families.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from worker.canary.binding import Kernel, OpBinding
from worker.canary.families import add_norm, attention, decode, glu, linear, moe, rope, softmax
from worker.canary.families import norm as norm_family
from worker.canary.families.norm import rstd as _rstd
from worker.canary.families.norm import rstd_for as _rstd_for
from worker.canary.kernel_call import call as _call
from worker.canary.ops import Act, Ops, RopeLayout, rmsnorm


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, table: torch.Tensor, b: OpBinding, kernel: Kernel) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.b, ctx.kernel, ctx.table_shape, ctx.table_dtype = b, kernel, tuple(table.shape), table.dtype
        return F.embedding(ids, table)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[None, torch.Tensor, None, None]:  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        v, h = ctx.table_shape
        got = _call(
            ctx.b,
            ctx.kernel,
            {"ids": ids.reshape(-1), "grad_output": g.reshape(-1, h), "num_embeddings": v, "padding_idx": -1},
            {"grad_table": (v, h)},
        )
        return None, got["grad_table"].to(ctx.table_dtype), None, None


class _EmbeddingNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, ids: torch.Tensor, table: torch.Tensor, w: torch.Tensor, eps: float, b: OpBinding, kernel: Kernel
    ) -> torch.Tensor:  # type: ignore[override]
        x = F.embedding(ids, table)
        ctx.save_for_backward(ids, x, w)
        ctx.b, ctx.kernel, ctx.eps, ctx.table_shape, ctx.table_dtype = b, kernel, eps, tuple(table.shape), table.dtype
        ctx.table = table
        return rmsnorm(x, w, eps)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        ids, x, w = ctx.saved_tensors
        v, h = ctx.table_shape
        x2 = x.reshape(-1, h)
        shapes = {"grad_table": (v, h), "grad_norm_weight": (h,)}
        got = _call(
            ctx.b,
            ctx.kernel,
            {
                "ids": ids.reshape(-1),
                "grad_output": g.reshape(-1, h),
                "x": x2,
                "table": ctx.table,
                "norm_weight": w,
                "rstd": _rstd_for(ctx.b, _rstd(x2, ctx.eps)),
                "eps": ctx.eps,
                "num_embeddings": v,
                "padding_idx": -1,
            },
            {k: s for k, s in shapes.items() if ctx.b.role_out(k) is not None},
        )
        gw = got.get("grad_norm_weight")
        if gw is None:  # the kernel gives only the table's gradient: the norm weight's comes from trusted autograd
            with torch.enable_grad():
                wd = w.detach().requires_grad_(True)
                (gw,) = torch.autograd.grad(rmsnorm(x.detach(), wd, ctx.eps), wd, g)
        return None, got["grad_table"].to(ctx.table_dtype), gw.to(w.dtype), None, None, None


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float, b: OpBinding, kernel: Kernel) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.b, ctx.kernel, ctx.eps = b, kernel, eps
        if b.role_out("y") is None:
            return rmsnorm(x, w, eps)
        h = x.shape[-1]
        x2 = x.reshape(-1, h)
        shapes = {"y": tuple(x2.shape), "rstd": tuple(_rstd_for(b, _rstd(x2, eps)).shape)}
        got = _call(
            b,
            kernel,
            {"x": x2, "norm_weight": w, "eps": eps},
            {k: s for k, s in shapes.items() if b.role_out(k) is not None},
        )
        return got["y"].reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        b: OpBinding = ctx.b
        if b.role_out("grad_x") is None:
            with torch.enable_grad():
                xd, wd = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
                gx, gw = torch.autograd.grad(rmsnorm(xd, wd, ctx.eps), (xd, wd), g)
            return gx, gw, None, None, None
        h = x.shape[-1]
        x2 = x.reshape(-1, h)
        shapes = {"grad_x": tuple(x2.shape), "grad_norm_weight": (h,)}
        got = _call(
            b,
            ctx.kernel,
            {
                "grad_output": g.reshape(-1, h),
                "x": x2,
                "norm_weight": w,
                "rstd": _rstd_for(b, _rstd(x2, ctx.eps)),
                "eps": ctx.eps,
            },
            {k: s for k, s in shapes.items() if b.role_out(k) is not None},
        )
        gw = got.get("grad_norm_weight")
        if gw is None:
            with torch.enable_grad():
                wd = w.detach().requires_grad_(True)
                (gw,) = torch.autograd.grad(rmsnorm(x.detach(), wd, ctx.eps), wd, g)
        return got["grad_x"].reshape(x.shape).to(x.dtype), gw.to(w.dtype), None, None, None


class _Loss(torch.autograd.Function):
    """Cross entropy (mean over tokens) from one kernel call giving the loss and/or grad_logits.

    A per-token loss output is averaged; a grad_logits output is taken as the gradient of the
    op's own loss output (of the mean when the loss is a scalar, of the sum when it is per token).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, b: OpBinding, kernel: Kernel) -> torch.Tensor:  # type: ignore[override]
        n, v = logits.shape
        loss_spec = b.role_out("loss")
        shapes: dict[str, tuple[int, ...]] = {"grad_logits": (n, v)}
        if loss_spec is not None:
            shapes["loss"] = () if loss_spec.rank == 0 else (n,)
        got = _call(
            b,
            kernel,
            {"logits": logits, "targets": targets, "ignore_index": -100},
            {k: s for k, s in shapes.items() if b.role_out(k) is not None},
        )
        ctx.save_for_backward(logits, targets)
        ctx.grad = got.get("grad_logits")
        if ctx.grad is not None and loss_spec is not None and loss_spec.rank == 1:
            ctx.grad = ctx.grad / n
        if "loss" in got:
            loss = got["loss"].float()
            return loss.mean() if loss.dim() else loss
        return F.cross_entropy(logits.float(), targets)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        logits, targets = ctx.saved_tensors
        if ctx.grad is None:
            with torch.enable_grad():
                ld = logits.detach().requires_grad_(True)
                (gl,) = torch.autograd.grad(F.cross_entropy(ld.float(), targets), ld, g)
            return gl, None, None, None
        return (ctx.grad.float() * g).to(logits.dtype), None, None, None


class _LogProbsLoss(torch.autograd.Function):
    """Cross entropy (mean over tokens) from a log-softmax kernel's log-probabilities: the loss is the targets' mean
    negative log-probability, its gradient (exp(log_probs) - onehot) / tokens, both from the kernel's output, as a
    fused log-softmax's backward takes the softmax from the output it saved."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, b: OpBinding, kernel: Kernel) -> torch.Tensor:  # type: ignore[override]
        n, v = logits.shape
        log_probs = _call(b, kernel, {"logits": logits}, {"log_probs": (n, v)})["log_probs"].float()
        ctx.save_for_backward(log_probs, targets)
        ctx.logits_dtype = logits.dtype
        return -log_probs.gather(1, targets.long()[:, None]).mean()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        log_probs, targets = ctx.saved_tensors
        grad = log_probs.exp()
        grad[torch.arange(grad.shape[0], device=grad.device), targets.long()] -= 1.0
        return (grad * (g / grad.shape[0])).to(ctx.logits_dtype), None, None, None


class KernelOps(Ops):
    """Plain ops everywhere except the binding's site, which calls `kernel`."""

    def __init__(self, binding: OpBinding, kernel: Kernel) -> None:
        self.b, self.kernel = binding, kernel

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        if self.b.site == "embedding":
            return _Embedding.apply(ids, table, self.b, self.kernel)  # type: ignore[no-any-return]
        return super().embed(ids, table)

    def embed_norm(self, ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.b.site == "embedding_norm":
            return _EmbeddingNorm.apply(ids, table, weight, eps, self.b, self.kernel)  # type: ignore[no-any-return]
        return super().embed_norm(ids, table, weight, eps)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.b.site == "norm" and self.b.options.layer_norm:
            return norm_family.apply_layer_norm(self.b, self.kernel, x, weight, eps)
        return super().layer_norm(x, weight, eps)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.b.site == "norm":
            return _Norm.apply(x, weight, eps, self.b, self.kernel)  # type: ignore[no-any-return]
        return super().norm(x, weight, eps)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.b.site == "loss" and self.b.options.log_probs:
            return _LogProbsLoss.apply(logits, targets, self.b, self.kernel)  # type: ignore[no-any-return]
        if self.b.site == "loss":
            return _Loss.apply(logits, targets, self.b, self.kernel)  # type: ignore[no-any-return]
        return super().loss(logits, targets)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: Act) -> torch.Tensor:
        if self.b.site == "linear":
            return linear.apply(self.b, self.kernel, x, w, b, act)
        return super().linear(x, w, b, act)

    def linear_residual(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, residual: torch.Tensor
    ) -> torch.Tensor:
        if self.b.site == "linear" and self.b.role_in("residual") is not None:
            return linear.apply(self.b, self.kernel, x, w, b, "none", residual)
        return super().linear_residual(x, w, b, residual)

    def glu(self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: Act) -> torch.Tensor:
        if self.b.site == "glu":
            return glu.apply(self.b, self.kernel, x, w_gate, w_up, act)
        return super().glu(x, w_gate, w_up, act)

    def add_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.b.site == "add_norm" and not self.b.options.norm_then_add:
            return add_norm.apply(self.b, self.kernel, x, residual, weight, eps)
        return super().add_norm(x, residual, weight, eps)

    def norm_add(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.b.site == "add_norm" and self.b.options.norm_then_add:
            return add_norm.apply_norm_add(self.b, self.kernel, x, residual, weight, eps)
        return super().norm_add(x, residual, weight, eps)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        if self.b.site == "softmax":
            return softmax.apply(self.b, self.kernel, scores)
        return super().softmax(scores)

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float, layout: RopeLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.b.site == "rope":
            return rope.apply(self.b, self.kernel, q, k, positions, theta)
        return super().rope(q, k, positions, theta, layout)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.b.site == "attention":
            return attention.apply(self.b, self.kernel, q, k, v)
        return super().attention(q, k, v)

    def moe_route(self, logits: torch.Tensor, k: int, renorm: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self.b.site == "moe_routing":
            return moe.apply(self.b, self.kernel, logits, k)
        return super().moe_route(logits, k, renorm)

    def attention_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.b.site == "attention_decode":
            return decode.apply(self.b, self.kernel, q, k, v)
        return super().attention_decode(q, k, v)
