"""What every newer site family reads from a definition: its tensor arguments, their axes, names and constant sizes."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from worker.canary.binding import CanaryUnsupported, IOSpec, OpBinding, Site, SiteOptions
from worker.canary.profiles import CanaryProfile
from worker.formats import Definition
from worker.formats.definition import TensorSpec
from worker.numerics.dtypes import to_torch


@dataclass(frozen=True)
class Arg:
    """One input or output of a definition."""

    name: str
    spec: TensorSpec

    @property
    def rank(self) -> int | None:
        return None if self.spec.shape is None else len(self.spec.shape)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(self.spec.shape or ())

    @property
    def floating(self) -> bool:
        return to_torch(self.spec.dtype).is_floating_point

    def named(self, *words: str) -> bool:
        """Whether a word of the name (split at _ and digits, lower case) is one of `words`."""
        return bool(set(re.split(r"[_\d]+", self.name.lower())) & set(words))


def inputs(d: Definition) -> list[Arg]:
    return [Arg(k, v) for k, v in d.inputs.items()]


def outputs(d: Definition) -> list[Arg]:
    return [Arg(k, v) for k, v in d.outputs.items()]


def tensors(args: list[Arg]) -> list[Arg]:
    """The float tensors (not scalars, not ids)."""
    return [a for a in args if a.rank is not None and a.rank >= 1 and a.floating]


def scalars(args: list[Arg]) -> list[Arg]:
    return [a for a in args if a.rank is None]


def const(d: Definition, axis: str) -> int | None:
    """The axis's value where the definition fixes it (a const axis), else None."""
    a = d.axes.get(axis)
    return a.value if a is not None and a.type == "const" else None


def head_dims(
    d: Definition, p: CanaryProfile, q_heads: str, kv_heads: str, head_dim: str, fixed: dict[str, int]
) -> dict[str, int]:
    """The model's heads from an attention's constant axes, added to `fixed`: the query heads, key/value heads of
    their own where k's head axis is not q's (grouped-query attention: the definition's count, or half the query
    heads), and the width from a constant head size."""
    out = dict(fixed)
    if const(d, q_heads) is not None:
        out["n_heads"] = const(d, q_heads)  # type: ignore[assignment]
    heads = out.get("n_heads", p.n_heads)
    if kv_heads != q_heads:
        out["n_kv_heads"] = const(d, kv_heads) or max(1, heads // 2)
    if const(d, head_dim) is not None:
        out["d_model"] = heads * const(d, head_dim)  # type: ignore[operator]
    return out


# the reference's words for a root mean square (an RMSNorm, alone or after a residual add)
RMS_WORDS = ("rsqrt", "sqrt", "rms_norm", "norm(")


def source(d: Definition) -> str:
    """The reference's source with comments dropped (a word in a comment is no evidence of what it computes)."""
    return "\n".join(line.split("#", 1)[0] for line in d.reference.splitlines())


def require(d: Definition, words: tuple[str, ...], missing: str) -> str:
    """The reference's source, where it has one of `words`; else CanaryUnsupported("the reference computes no " +
    missing): the signature may fit, but nothing in the reference computes the site's op."""
    text = source(d)
    if not any(w in text for w in words):
        raise CanaryUnsupported(f"the reference computes no {missing}")
    return text


def make(site: Site, d: Definition, ins: dict[str, str], outs: dict[str, str], options: SiteOptions) -> OpBinding:
    """The binding, every argument in the definition's order with its role (`ins`/`outs`: name -> role)."""
    problems = [f"input '{k}' has no role at site {site}" for k in d.inputs if k not in ins]
    problems += [f"output '{k}' has no role at site {site}" for k in d.outputs if k not in outs]
    for group in (ins, outs):
        roles = list(group.values())
        problems += [f"two arguments share role {r}" for r in sorted(set(roles)) if roles.count(r) > 1]
    if problems:
        raise CanaryUnsupported(f"{d.name} at site '{site}': " + "; ".join(problems))
    return OpBinding(
        site=site,
        definition=d.name,
        options=options,
        inputs=[
            IOSpec(name=k, role=ins[k], rank=None if v.shape is None else len(v.shape), dtype=v.dtype)
            for k, v in d.inputs.items()
        ],
        outputs=[IOSpec(name=k, role=outs[k], rank=len(v.shape or []), dtype=v.dtype) for k, v in d.outputs.items()],
    )


def scalar_roles(site: Site, args: list[Arg], known: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Roles of the scalar inputs by name (`known`: role -> words of the name); any other scalar does not fit."""
    out: dict[str, str] = {}
    for a in scalars(args):
        role = next((r for r, words in known.items() if a.named(*words)), None)
        if role is None:
            raise CanaryUnsupported(f"scalar input '{a.name}' has no known role at site {site}")
        out[a.name] = role
    return out


def site_gives(b: OpBinding, given: tuple[str, ...], op: str) -> None:
    """Refuses inputs whose roles the site does not hand its kernel (`given`): the original sites' roles take any
    other argument for something, and the kernel could not run in the model without it."""
    extra = [f"{s.name} (as {s.role})" for s in b.inputs if s.role not in given]
    if extra:
        raise CanaryUnsupported(f"{op} takes no {', '.join(extra)}; the site hands its kernel {', '.join(given)}")


def flat(t: torch.Tensor, rank: int) -> torch.Tensor:
    """t with its leading axes merged so that it has `rank` axes ([B, T, D] at rank 2: [B*T, D])."""
    return t if rank >= t.dim() else t.reshape(flat_shape(tuple(t.shape), rank))


def flat_shape(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`flat`'s shape for a tensor of this shape."""
    if rank >= len(shape):
        return shape
    lead = 1
    for n in shape[: len(shape) - rank + 1]:
        lead *= n
    return (lead, *shape[len(shape) - rank + 1 :])


def rows_dims(b: OpBinding, d: Definition, p: CanaryProfile) -> dict[str, int]:
    """The model at the sizes a definition fixes for its x [tokens, hidden]: d_model from a constant hidden axis, the
    batch from a constant token count (a norm's rows are every token of the batch)."""
    tokens, hidden = d.inputs[next(s.name for s in b.inputs if s.role == "x")].shape or ["", ""]
    out = {"d_model": const(d, hidden)} if const(d, hidden) is not None else {}
    return {**out, **token_count(p, const(d, tokens))}  # type: ignore[dict-item]


def token_count(p: CanaryProfile, tokens: int | None) -> dict[str, int]:
    """The batch size that makes a definition's constant token count (batch x sequence, flattened)."""
    if tokens is None:
        return {}
    if tokens % p.seq_len:
        raise CanaryUnsupported(
            f"a constant token count of {tokens} is no multiple of the canary's {p.seq_len}-token sequences"
        )
    return {"batch_size": tokens // p.seq_len}


def normal(shape: tuple[int, ...], gen: torch.Generator, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * std


AutocastState = tuple[str, bool, torch.dtype]


def autocast_state(t: torch.Tensor) -> AutocastState:
    """The autocast an autograd Function's forward runs under on t's device, for its backward to run under as well.
    The backward runs outside the model's autocast region, where trusted ops would meet a bf16 activation and an fp32
    weight (torch.amp.custom_bwd does the same for one device type fixed in advance)."""
    device = t.device.type
    return device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)


def under(state: AutocastState) -> torch.autocast:
    device, enabled, dtype = state
    return torch.autocast(device, dtype=dtype, enabled=enabled)
