"""The canary decoder's arithmetic, written once for K members whose weights are stacked on a leading axis [K, ...].

worker.canary.stacked trains K members at once with it; worker.canary.model's single model is the case K = 1.
Every member sees the same batch; the trusted layers run once for all members (batched matmuls, one attention call
over K x batch), and the op at the binding's site is called once per member, each with its own ops (the site's
kernel, or the trusted op).

One block, pre-norm (x is the normalised input of a sublayer, r the residual stream):
    x, r = add_norm(attention(x), r, norm2);  x, r = add_norm(mlp(x), r, next norm1 or final_norm)
where add_norm(a, r, w) = (norm(r + a, w), r + a) unless the add_norm site's kernel does both; post-norm:
    h = add_norm(attention(h), h, norm1)[0];  h = add_norm(mlp(h), h, norm2)[0]
OLMo 2/3's norm-then-add (arch.norm_then_add: the add_norm site's kernel normalises its x before adding the residual):
    h = norm_add(attention(h), h, norm1);  h = norm_add(mlp(h), h, norm2);  ...;  final_norm(h)
where norm_add(a, r, w) = r + norm(a, w): the stream is never normalised in a block, so the head reads it through the
final norm, as OLMo's does.
Attention: qkv projection, RoPE on q and k (arch.rope), softmax(q k^T / sqrt(d)) v written out (arch.attention ==
"softmax"), fused SDPA, or the attention site's kernel (prefill, or one decode step per position), output projection.
MLP: act(fc1 x) -> fc2, or a GLU act(gate x) * (up x) -> fc2, or a mixture of experts: the router's logits, their
top-k routing (arch.mlp == "moe"), and the picked experts' act(fc1 x) -> fc2 summed with its weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from worker.canary.arch import Arch
from worker.canary.ops import Act, Ops, activation, attention_scale, causal_mask, matmul_t, rmsnorm
from worker.canary.profiles import CanaryProfile

TRUSTED = Ops()


def rope_positions(batch: int, seq_len: int, p: CanaryProfile, device: torch.device) -> torch.Tensor:
    """[batch, seq_len] positions: sequence i starts at i x (rope_max_position - seq_len) / batch."""
    stride = max(p.rope_max_position - seq_len, 0) // max(batch, 1)
    return (torch.arange(batch, device=device) * stride)[:, None] + torch.arange(seq_len, device=device)


class Decoder:
    """The decoder on `params` ([K, ...] each, named as worker.canary.model.param_shapes names them)."""

    def __init__(self, p: CanaryProfile, arch: Arch, ops: Sequence[Ops], params: Mapping[str, torch.Tensor]) -> None:
        self.p, self.arch, self.ops, self.P = p, arch, list(ops), params
        self.eps = p.norm_eps

    def _at_site(self, op: str) -> bool:
        return self.arch.site_op == op

    # the ops that may be the site's --------------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.arch.norm == "layer":  # the model's norms are the site's, in training and in trusted evaluation alike
            return torch.stack([o.layer_norm(x[m], w[m], self.eps) for m, o in enumerate(self.ops)])
        if self._at_site("norm"):
            return torch.stack([o.norm(x[m], w[m], self.eps) for m, o in enumerate(self.ops)])
        return rmsnorm(x, w[:, None, None, :], self.eps)

    def _add_norm(self, a: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._at_site("add_norm"):
            pairs = [o.add_norm(a[m], r[m], w[m], self.eps) for m, o in enumerate(self.ops)]
            return torch.stack([y for y, _ in pairs]), torch.stack([s for _, s in pairs])
        s = r + a
        return self._norm(s, w), s

    def _norm_add(self, a: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self._at_site("norm_add"):
            return torch.stack([o.norm_add(a[m], r[m], w[m], self.eps) for m, o in enumerate(self.ops)])
        return r + self._norm(a, w)

    def _linear(self, x: torch.Tensor, name: str, act: Act, at_site: bool) -> torch.Tensor:
        w, b = self.P[name + ".weight"], self.P.get(name + ".bias")
        if at_site:
            return torch.stack([o.linear(x[m], w[m], None if b is None else b[m], act) for m, o in enumerate(self.ops)])
        return TRUSTED.linear(x, w, None if b is None else b[:, None, None, :], act)

    def _glu(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        wg, wu, act = self.P[pre + "gate.weight"], self.P[pre + "up.weight"], self.arch.act
        if self._at_site("glu"):
            return torch.stack([o.glu(x[m], wg[m], wu[m], act) for m, o in enumerate(self.ops)])
        return TRUSTED.glu(x, wg, wu, act)

    def _softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """scores [K, batch, heads, queries, keys]."""
        if self._at_site("softmax"):
            return torch.stack([o.softmax(scores[m]) for m, o in enumerate(self.ops)])
        return TRUSTED.softmax(scores)

    def _rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [K, batch, tokens, heads, head_dim]."""
        assert self.arch.rope is not None
        pos = rope_positions(q.shape[1], q.shape[2], self.p, q.device)
        theta = self.arch.rope_theta or self.p.rope_theta
        if self._at_site("rope"):
            pairs = [o.rope(q[m], k[m], pos, theta, self.arch.rope) for m, o in enumerate(self.ops)]
            return torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])
        return TRUSTED.rope(q, k, pos, theta, self.arch.rope)

    # the layers ------------------------------------------------------------------------------------------------

    def _attention(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        k, b, t, d = x.shape
        h, hkv = self.p.n_heads, self.p.kv_heads
        dh = d // h
        q, kk, v = TRUSTED.linear(x, self.P[pre + "qkv.weight"], None, "none").split(
            [h * dh, hkv * dh, hkv * dh], dim=-1
        )
        if self.arch.rope is not None:
            q, kk = self._rope(q.reshape(k, b, t, h, dh), kk.reshape(k, b, t, hkv, dh))
        q, kk, v = (z.reshape(k * b, t, n, dh).transpose(1, 2) for z, n in ((q, h), (kk, hkv), (v, hkv)))
        a = self._attend(q, kk, v)
        return TRUSTED.linear(a.transpose(1, 2).reshape(k, b, t, d), self.P[pre + "proj.weight"], None, "none")

    def _attend(self, q: torch.Tensor, kk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [K x batch, heads, tokens, head_dim], kk and v [K x batch, kv_heads, tokens, head_dim]: causal attention."""
        k, (kb, h, t, dh) = len(self.ops), q.shape
        if self._at_site("attention") or self._at_site("attention_decode"):
            # the kernel's: per member, key/value heads as they are
            qs, ks, vs = (z.reshape(k, kb // k, -1, t, dh) for z in (q, kk, v))
            decode = self._at_site("attention_decode")
            outs = [
                (o.attention_decode if decode else o.attention)(qs[m], ks[m], vs[m]) for m, o in enumerate(self.ops)
            ]
            return torch.stack(outs).reshape(kb, h, t, dh)
        if kk.shape[1] != h:
            kk, v = (z.repeat_interleave(h // kk.shape[1], dim=1) for z in (kk, v))
        if self.arch.attention != "softmax":
            return F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        scores = (q @ kk.transpose(-1, -2)) * attention_scale(dh)
        scores = scores.masked_fill(causal_mask(t, q.device), -torch.inf)
        return self._softmax(scores.reshape(k, kb // k, h, t, t)).reshape(kb, h, t, t) @ v

    def _moe(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        """x [K, batch, tokens, d_model]: the router's logits, their top-k routing (the site's op, per member), and the
        k experts' outputs mixed with its weights. Every expert runs on every token (at these sizes one batched
        product beats a gather per expert; an expert's output where it was not picked gets no gradient)."""
        logits = matmul_t(x, self.P[pre + "router.weight"])
        routes = [o.moe_route(logits[m], self.p.top_k, self.arch.moe_renorm) for m, o in enumerate(self.ops)]
        w, ids = torch.stack([r[0] for r in routes]), torch.stack([r[1] for r in routes])  # [K, batch, tokens, k]
        h = activation(torch.einsum("kbtd,kefd->kbtef", x, self.P[pre + "expert_fc1.weight"]), self.arch.act)
        y = torch.einsum("kbtef,kedf->kbted", h, self.P[pre + "expert_fc2.weight"])
        picked = y.gather(3, ids.unsqueeze(-1).expand(*ids.shape, y.shape[-1]))  # [K, batch, tokens, k, d_model]
        return (w.unsqueeze(-1).to(picked.dtype) * picked).sum(3)

    def _mlp(self, x: torch.Tensor, pre: str) -> torch.Tensor:
        a = self.arch
        if a.mlp == "moe":
            return self._moe(x, pre)
        u = self._glu(x, pre) if a.mlp == "glu" else self._linear(x, pre + "fc1", a.act, a.linear_at == "fc1")
        return self._linear(u, pre + "fc2", "none", a.linear_at == "fc2")

    def _mlp_residual(self, x: torch.Tensor, r: torch.Tensor, pre: str) -> torch.Tensor:
        """r + fc2(act(fc1 x)), the last two in one call of the linear site's kernel."""
        u = self._linear(x, pre + "fc1", self.arch.act, False)
        w, b = self.P[pre + "fc2.weight"], self.P.get(pre + "fc2.bias")
        return torch.stack(
            [o.linear_residual(u[m], w[m], None if b is None else b[m], r[m]) for m, o in enumerate(self.ops)]
        )

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        tables = self.P["tok_emb"]
        if self.arch.emb_norm:
            ws = self.P["emb_norm"]
            return torch.stack([o.embed_norm(ids, tables[m], ws[m], self.eps) for m, o in enumerate(self.ops)])
        return torch.stack([o.embed(ids, tables[m]) for m, o in enumerate(self.ops)])

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """[K, batch, tokens, d_model]: the normalised last hidden state the head reads."""
        P, n = self.P, self.p.n_layers
        h = self._embed(ids)
        if self.arch.norm_then_add:
            for i in range(n):
                h = self._norm_add(self._attention(h, f"blocks.{i}."), h, P[f"blocks.{i}.norm1"])
                h = self._norm_add(self._mlp(h, f"blocks.{i}."), h, P[f"blocks.{i}.norm2"])
            return self._norm(h, P["final_norm"])
        if self.arch.post_norm:
            for i in range(n):
                h = self._add_norm(self._attention(h, f"blocks.{i}."), h, P[f"blocks.{i}.norm1"])[0]
                h = self._add_norm(self._mlp(h, f"blocks.{i}."), h, P[f"blocks.{i}.norm2"])[0]
            return h
        x, r = self._norm(h, P["blocks.0.norm1"]), h
        for i in range(n):
            x, r = self._add_norm(self._attention(x, f"blocks.{i}."), r, P[f"blocks.{i}.norm2"])
            after = P[f"blocks.{i + 1}.norm1"] if i + 1 < n else P["final_norm"]
            if self.arch.linear_residual:  # the kernel's down-projection adds the residual stream itself
                r = self._mlp_residual(x, r, f"blocks.{i}.")
                x = self._norm(r, after)
                continue
            x, r = self._add_norm(self._mlp(x, f"blocks.{i}."), r, after)
        return x

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        return TRUSTED.linear(self.hidden(ids), self.P["head.weight"], None, "none")

    def losses(self, seq: torch.Tensor) -> torch.Tensor:
        """seq: [batch, T+1] token ids, the same for every member; [K] next-token losses."""
        ids, targets = seq[:, :-1], seq[:, 1:]
        flat = targets.reshape(-1)
        return torch.stack([o.loss(lg.reshape(-1, lg.shape[-1]), flat) for o, lg in zip(self.ops, self.logits(ids))])
