"""Where the op's arguments come from in the model: each definition input and output gets a role.

The roles are read from the definition (names, ranks, dtypes), so a new problem plugs into
its site without code here: `indices` -> ids, `grad_output` -> the upstream gradient, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

import torch
from pydantic import BaseModel, ConfigDict

from worker.canary.ops import Act, RopeLayout
from worker.formats import Definition
from worker.numerics.dtypes import to_torch
from worker.problem_spec import CanarySite

Site = CanarySite
SITES: tuple[Site, ...] = get_args(Site)

# args in the definition's input order, output specs ({shape, dtype}) in its output order -> outputs
Kernel = Callable[[list[Any], list[dict[str, Any]]], list[torch.Tensor]]


class CanaryUnsupported(ValueError):
    """The definition's signature does not say how it plugs into its declared site."""


class IOSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    role: str
    rank: int | None
    dtype: str


class SiteOptions(BaseModel):
    """How a definition's op is laid out where the signature alone does not say (worker.canary.matching settles
    these by running the reference); the defaults are what the four original sites assume."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    act: Act = "none"  # a linear's fused activation, or a GLU's gate activation
    gate_first: bool = True  # a GLU's one [gate | up] tensor (False: [up | gate])
    rope_layout: RopeLayout = "neox"
    rope_theta: float | None = None  # a RoPE whose definition fixes its own theta (None: an input, or the model's)
    # a RoPE given cos/sin tables of head_dim/2 columns, one per rotated pair (False: head_dim columns, each pair's
    # angle in both of its slots); a role's rank and dtype don't say a table's width, and the site builds the tables
    rope_half_table: bool = False
    weight_in_out: bool = False  # a linear's weight as [in, out] (y = x @ W) instead of [out, in]
    heads_first: bool = True  # an attention's q, k, v as [batch, heads, tokens, head_dim] (False: tokens first)
    moe_renorm: bool = (
        True  # an MoE routing's top-k probabilities renormalised to sum to 1 (False: as softmax gave them)
    )
    # a loss-site op that gives the log-probabilities [tokens, vocab] (a log-softmax), from which the trusted code
    # takes the mean negative log-likelihood of the targets and its gradient
    log_probs: bool = False
    # a norm-site op that is a LayerNorm (x - mean, scaled by the weight, plus a bias): the model's norms become
    # LayerNorms
    layer_norm: bool = False
    # a one-output add+norm that normalises x first and then adds the residual, y = residual + rmsnorm(x) * weight:
    # OLMo 2/3's post-norm block, h = h + norm(sublayer(h)). Its signature is the add-then-norm's (x, residual,
    # weight, eps -> y), so only the reference tells the two apart
    norm_then_add: bool = False


class OpBinding(BaseModel):
    """Serialisable (crosses into the child): the site and the role of every input and output."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    site: Site
    definition: str
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    options: SiteOptions = SiteOptions()

    def role_in(self, role: str) -> IOSpec | None:
        return next((s for s in self.inputs if s.role == role), None)

    def role_out(self, role: str) -> IOSpec | None:
        return next((s for s in self.outputs if s.role == role), None)

    @property
    def has_backward(self) -> bool:
        return self.role_in("grad_output") is not None

    def args(self, values: dict[str, Any]) -> list[Any]:
        out: list[Any] = []
        for s in self.inputs:
            if s.role not in values:
                raise CanaryUnsupported(f"{self.definition}: no value for input '{s.name}' (role {s.role})")
            v = values[s.role]
            if isinstance(v, torch.Tensor):
                v = v.detach().to(to_torch(s.dtype)).contiguous()
            elif s.dtype.startswith("float"):
                v = float(v)
            else:
                v = int(v)
            out.append(v)
        return out

    def out_specs(self, shapes: dict[str, tuple[int, ...]]) -> list[dict[str, Any]]:
        missing = [s.role for s in self.outputs if s.role not in shapes]
        if missing:
            raise CanaryUnsupported(f"{self.definition}: the site gives no shape for outputs {missing}")
        return [{"shape": list(shapes[s.role]), "dtype": s.dtype} for s in self.outputs]

    def outputs_by_role(self, outs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        if len(outs) != len(self.outputs):
            raise ValueError(f"the kernel returned {len(outs)} output(s); {self.definition} has {len(self.outputs)}")
        return {s.role: o for s, o in zip(self.outputs, outs)}


def _low(name: str) -> str:
    return name.lower()


def _input_role(site: Site, name: str, rank: int | None, dtype: str) -> str:
    n = _low(name)
    if rank is None:
        if "eps" in n:
            return "eps"
        if "num_embeddings" in n or "vocab" in n:
            return "num_embeddings"
        if "padding" in n:
            return "padding_idx"
        if "ignore" in n:
            return "ignore_index"
        raise CanaryUnsupported(f"scalar input '{name}' has no known role at site {site}")
    if not to_torch(dtype).is_floating_point:
        return "targets" if site == "loss" else "ids"
    if n.startswith("grad") or n in ("dy", "dout", "d_out"):
        return "grad_output"
    if "rstd" in n or "inv_rms" in n or "rsigma" in n:
        return "rstd"
    if site == "loss":
        return "logits"
    if rank == 1:
        return "norm_weight"
    if "table" in n or "embedding_weight" in n or n in ("embedding", "weight_table"):
        return "table"
    return "x"


def _output_role(site: Site, name: str, rank: int, n_outputs: int) -> str:
    n = _low(name)
    if site == "embedding":
        return "grad_table"
    if site == "embedding_norm":
        return "grad_table" if rank == 2 else "grad_norm_weight"
    if site == "loss":
        return "grad_logits" if rank == 2 else "loss"
    # norm
    if "rstd" in n or "inv_rms" in n:
        return "rstd"
    if rank == 1:
        return "grad_norm_weight"
    if n.startswith("grad") or n in ("dx",):
        return "grad_x"
    return "y"


_REQUIRED: dict[str, tuple[set[str], set[str]]] = {
    # site: (input roles that must be present, output roles that must be present)
    "embedding": ({"ids", "grad_output"}, {"grad_table"}),
    "embedding_norm": ({"ids", "grad_output", "norm_weight"}, {"grad_table"}),
    "norm": ({"x", "norm_weight"}, set()),
    "loss": ({"logits", "targets"}, set()),
}
# the sites bound by the roles above, as they were before any site was matched from a signature
ORIGINAL_SITES: frozenset[str] = frozenset(_REQUIRED)


def bind(site: Site, definition: Definition, options: SiteOptions | None = None) -> OpBinding:
    """The definition's arguments at `site`; raises CanaryUnsupported when its signature does not fit there."""
    if site not in _REQUIRED:
        # the newer sites bind in their own modules (worker.canary.families), which import this one
        from worker.canary.families import bind_family

        return bind_family(site, definition, options or SiteOptions())
    ins = [
        IOSpec(
            name=k,
            role=_input_role(site, k, None if v.shape is None else len(v.shape), v.dtype),
            rank=None if v.shape is None else len(v.shape),
            dtype=v.dtype,
        )
        for k, v in definition.inputs.items()
    ]
    outs = [
        IOSpec(
            name=k,
            role=_output_role(site, k, len(v.shape or []), len(definition.outputs)),
            rank=len(v.shape or []),
            dtype=v.dtype,
        )
        for k, v in definition.outputs.items()
    ]
    # a 2-D float input indexed by something other than the token axis is the embedding table
    ids_axis = next(
        (v.shape[0] for v in definition.inputs.values() if v.shape and not to_torch(v.dtype).is_floating_point), None
    )
    for i, (_name, v) in enumerate(definition.inputs.items()):
        if (
            ins[i].role == "x"
            and site in ("embedding", "embedding_norm")
            and v.shape
            and ids_axis is not None
            and v.shape[0] != ids_axis
        ):
            ins[i] = ins[i].model_copy(update={"role": "table"})
    need_in, need_out = _REQUIRED[site]
    have_in, have_out = {s.role for s in ins}, {s.role for s in outs}
    problems = [f"no input for role {r}" for r in sorted(need_in - have_in)]
    problems += [f"no output for role {r}" for r in sorted(need_out - have_out)]
    for group in (ins, outs):
        roles = [s.role for s in group]
        problems += [f"two arguments share role {r}" for r in set(roles) if roles.count(r) > 1]
    if site == "norm" and not ({"y", "grad_x"} & have_out):
        problems.append("a norm op must output y (forward) or grad_x (backward)")
    if site == "loss" and not ({"loss", "grad_logits"} & have_out):
        problems.append("a loss op must output the loss or grad_logits")
    if problems:
        raise CanaryUnsupported(f"{definition.name} at site '{site}': " + "; ".join(problems))
    return OpBinding(site=site, definition=definition.name, inputs=ins, outputs=outs)
