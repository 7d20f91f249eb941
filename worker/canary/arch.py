"""Which variant of the canary's decoder a site trains: the site's op must be in the model, where it matters.

The four original sites train the original model (pre-norm RMSNorm, attention through SDPA, a GELU MLP, no biases),
so their runs stay what they were. A newer site switches on the part that holds its op: a gated MLP for a GLU, an
explicit softmax in attention, rotary embeddings on q and k, a post-norm residual (or OLMo's norm-then-add block),
biases on the MLP's projections, a mixture-of-experts feed-forward whose router's top-k routing is the site's op.
Derived from the binding alone, so the parent and the submission's process build the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.canary.binding import OpBinding, Site
from worker.canary.ops import Act, RopeLayout

# the Ops method that carries the kernel at each site
SITE_OP: dict[str, str] = {
    "embedding": "embed",
    "embedding_norm": "embed_norm",
    "norm": "norm",  # or "layer_norm", where the binding is a LayerNorm (arch_of)
    "loss": "loss",
    "linear": "linear",
    "glu": "glu",
    "add_norm": "add_norm",  # or "norm_add", where the binding normalises before it adds (arch_of)
    "softmax": "softmax",
    "rope": "rope",
    "attention": "attention",
    "moe_routing": "moe_route",
    "attention_decode": "attention_decode",
}


@dataclass(frozen=True)
class Arch:
    site_op: str = "embed"
    emb_norm: bool = False  # a norm right after the embedding (the fused embedding+RMSNorm site)
    # fc1 -> act -> fc2, or act(gate) * up -> fc2, or a mixture of experts (each fc1 -> act -> fc2) routed top-k
    mlp: Literal["plain", "glu", "moe"] = "plain"
    moe_renorm: bool = True  # the MoE's top-k routing weights renormalised to sum to 1
    act: Act = "gelu"
    mlp_bias: bool = False
    linear_at: Literal["fc1", "fc2"] | None = None  # the projection the linear site's kernel computes
    linear_residual: bool = False  # the linear site's kernel (at fc2) adds the residual stream to its output too
    attention: Literal["sdpa", "softmax"] = "sdpa"
    rope: RopeLayout | None = None
    rope_theta: float | None = None  # a RoPE definition's own theta (None: the profile's, passed to the kernel)
    post_norm: bool = False  # h = norm(h + sublayer(h)) instead of h + sublayer(norm(h))
    # OLMo 2/3's block, h = h + norm(sublayer(h)) (the sublayer's output normalised, then added), and a final norm
    # before the head: the residual stream itself is never normalised inside the blocks
    norm_then_add: bool = False
    norm: Literal["rms", "layer"] = "rms"  # every norm of the model an RMSNorm, or a LayerNorm (its bias zero)


def arch_of(site_or_binding: Site | OpBinding) -> Arch:
    """The model a site trains; a bare site name gives the defaults of its binding's options."""
    if isinstance(site_or_binding, str):
        site, o, b = site_or_binding, None, None
    else:
        b = site_or_binding
        site, o = b.site, b.options
    base = Arch(site_op=SITE_OP[site])
    if site == "embedding_norm":
        return Arch(site_op="embed_norm", emb_norm=True)
    if site == "linear" and b is not None and o is not None:
        # a kernel with its own activation is the up-projection (fc1 then act); a bare GEMM is the down-projection,
        # the model's longest reduction (d_ff); a GEMM's backward sits there too
        fused = o.act != "none" and not b.has_backward
        return Arch(
            site_op="linear",
            act=o.act if fused else "gelu",
            mlp_bias=b.role_in("bias") is not None,
            linear_at="fc1" if fused else "fc2",
            linear_residual=b.role_in("residual") is not None,
        )
    if site == "linear":
        return Arch(site_op="linear", linear_at="fc2")
    if site == "glu":
        return Arch(site_op="glu", mlp="glu", act=o.act if o is not None and o.act != "none" else "silu")
    if site == "norm" and o is not None and o.layer_norm:
        return Arch(site_op="layer_norm", norm="layer")
    if site == "add_norm":
        if o is not None and o.norm_then_add:
            return Arch(site_op="norm_add", norm_then_add=True)
        return Arch(site_op="add_norm", post_norm=b is not None and b.role_out("residual") is None)
    if site == "softmax":
        return Arch(site_op="softmax", attention="softmax")
    if site == "moe_routing":
        return Arch(site_op="moe_route", mlp="moe", moe_renorm=o.moe_renorm if o is not None else True)
    if site == "rope":
        return Arch(
            site_op="rope",
            rope=o.rope_layout if o is not None else "neox",
            rope_theta=o.rope_theta if o is not None else None,
        )
    return base
