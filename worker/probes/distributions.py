"""Probe input generators: the distributions real training produces, and adversarial ones.

audit.json `probes[].inputs` maps an input name to {"kind": ..., params}. Inputs are
generated in the order the probe lists them; each generator sees the axes and the
inputs generated so far. Float tensor inputs a probe does not list get "normal"
std 1; int tensors and scalars must be listed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from worker.formats import Definition, Workload
from worker.formats.workload import ScalarInput
from worker.inputs import Case, build_case
from worker.numerics.dtypes import to_torch
from worker.probes.token_stats import LoadedTokenStats
from worker.problem_spec import InputGenerator, ProbeSpec
from worker.reference import ReferenceRunner
from worker.text import text_token_ids


class ProbeInputError(ValueError):
    """A probe's inputs cannot be generated as written (an audit.json problem, not the submission's)."""


@dataclass(frozen=True)
class GenContext:
    """What one generator sees: the input it makes, the axes and the inputs made so far."""

    probe: str
    name: str
    shape: tuple[int, ...] | None  # None: a scalar argument
    dtype: torch.dtype
    axes: dict[str, int]
    done: dict[str, Any]
    gen: torch.Generator
    # the user's token statistics: real-text ids come from them instead of the built-in corpus
    token_stats: LoadedTokenStats | None = None
    notes: list[str] | None = None
    # large float draws come from this generator when given (the audit's GPU: a second, not a minute, on the CPU)
    bulk: torch.Generator | None = None

    def randn(self, *shape: int) -> torch.Tensor:
        """Standard normals for a float input, as fp64, drawn in fp32 (fp64 only for an fp64 input: fp32 is half the
        work and is rounded to the input's dtype anyway). With a `bulk` generator they are drawn, and stay, on its
        device: the generator's arithmetic on them runs there too (`here` brings its CPU-made pieces), and
        `_as_float` brings the rounded result to the CPU. Elementwise fp64 arithmetic rounds the same on both, so the
        inputs are those the CPU would compute from the same draws (H200 test in tests/worker/test_probes_stage.py)."""
        dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        if self.bulk is not None:
            return torch.randn(shape, generator=self.bulk, dtype=dtype, device=self.bulk.device).to(torch.float64)
        return torch.randn(shape, generator=self.gen, dtype=dtype).to(torch.float64)

    def here(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor made on the CPU (from `gen`), moved to where `randn` draws."""
        return t.to(self.bulk.device) if self.bulk is not None else t

    def axis(self, axis: str) -> int:
        if axis not in self.axes:
            raise ProbeInputError(
                f"probe '{self.probe}', input '{self.name}': unknown axis '{axis}' (axes: {sorted(self.axes)})"
            )
        return self.axes[axis]

    def earlier(self, name: str) -> Any:
        if name not in self.done:
            raise ProbeInputError(
                f"probe '{self.probe}', input '{self.name}': needs input '{name}', which must be listed before it"
            )
        return self.done[name]

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    def fail(self, message: str) -> ProbeInputError:
        return ProbeInputError(f"probe '{self.probe}', input '{self.name}': {message}")


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IdsParams(_Params):
    high_axis: str = "vocab_size"


class ZipfParams(IdsParams):
    s: float = Field(1.0, gt=0)


class HotIdParams(IdsParams):
    fraction: float = Field(0.5, gt=0, le=1)


class PaddingParams(IdsParams):
    fraction: float = Field(0.3, gt=0, le=1)
    pad_from: str = "padding_idx"
    pad_value: int | None = Field(None, description="the pad id itself (instead of reading it from input pad_from)")
    base: Literal["zipf_ids", "real_text_ids", "uniform_ids"] = "zipf_ids"
    s: float = Field(1.0, gt=0)


class NormalParams(_Params):
    std: float = Field(1.0, gt=0)
    mean: float = 0.0


class ZeroRowsParams(_Params):
    fraction: float = Field(0.25, gt=0, le=1)
    std: float = Field(1.0, gt=0)


class PositiveParams(_Params):
    scale: float = Field(1e-3, gt=0)


class SharedDirectionParams(_Params):
    ids_from: str = "indices"
    std: float = Field(1e-3, gt=0)
    noise: float = Field(0.1, ge=0)


class ScalarParams(_Params):
    value: int | float | bool


class FromAxisParams(_Params):
    axis: str


class UniformIntParams(_Params):
    low: int = 0
    high: int | None = Field(None, description="exclusive upper end; or high_axis")
    high_axis: str | None = Field(None, description="the axis whose size is the exclusive upper end")

    @model_validator(mode="after")
    def _one_high(self) -> "UniformIntParams":
        if (self.high is None) == (self.high_axis is None):
            raise ValueError("give exactly one of high and high_axis")
        return self


class OffsetRowsParams(_Params):
    std: float = Field(1.0, gt=0, description="the spread within a row")
    min_ratio: float = Field(1e3, gt=0, description="smallest |row mean| / std")
    max_ratio: float = Field(1e4, gt=0, description="largest |row mean| / std")

    @model_validator(mode="after")
    def _ordered(self) -> "OffsetRowsParams":
        if self.max_ratio < self.min_ratio:
            raise ValueError("max_ratio is below min_ratio")
        return self


# --- token ids --------------------------------------------------------------


def _as_ids(ctx: GenContext, flat: torch.Tensor) -> torch.Tensor:
    if ctx.shape is None:
        raise ctx.fail("id generators make tensors; this input is a scalar")
    if ctx.dtype.is_floating_point or ctx.dtype == torch.bool:
        raise ctx.fail(f"id generators make integer tensors; this input is {ctx.dtype}")
    return flat.reshape(ctx.shape).to(ctx.dtype)


def _uniform_flat(ctx: GenContext, high: int) -> torch.Tensor:
    return torch.randint(0, high, (ctx.numel,), generator=ctx.gen, dtype=torch.int64)


def _zipf_flat(ctx: GenContext, high: int, s: float) -> torch.Tensor:
    ranks = torch.arange(1, high + 1, dtype=torch.float64)
    probs = ranks.pow(-s)
    drawn = torch.multinomial(probs / probs.sum(), ctx.numel, replacement=True, generator=ctx.gen)
    perm = torch.randperm(high, generator=ctx.gen)
    return perm[drawn]


def _real_text_flat(ctx: GenContext, high: int) -> torch.Tensor:
    if ctx.token_stats is not None:
        ids, folded = ctx.token_stats.draw(ctx.numel, high, ctx.gen)
        if ctx.notes is not None:
            ctx.notes.append(
                f"input '{ctx.name}': ids drawn from the user's token statistics ({ctx.token_stats.kind}, "
                f"{ctx.token_stats.source})" + (f"; {folded} ids >= {high} folded into range" if folded else "")
            )
        return ids
    stream = text_token_ids(high)  # a cached tokenizer, not one trained per drawn vocabulary size
    n = ctx.numel
    if stream.numel() <= n:
        stream = stream.repeat(n // max(stream.numel(), 1) + 2)
    offset = int(torch.randint(0, stream.numel() - n, (1,), generator=ctx.gen))
    ids = stream[offset : offset + n].clone()
    if int(ids.max()) >= high:  # the tokenizer never has more ids than asked, but check: ids must be in range
        raise ctx.fail(f"the {high}-id tokenizer produced id {int(ids.max())}")
    return ids


def uniform_ids(ctx: GenContext, p: IdsParams) -> torch.Tensor:
    return _as_ids(ctx, _uniform_flat(ctx, ctx.axis(p.high_axis)))


def zipf_ids(ctx: GenContext, p: ZipfParams) -> torch.Tensor:
    return _as_ids(ctx, _zipf_flat(ctx, ctx.axis(p.high_axis), p.s))


def real_text_ids(ctx: GenContext, p: IdsParams) -> torch.Tensor:
    return _as_ids(ctx, _real_text_flat(ctx, ctx.axis(p.high_axis)))


def uniform_int(ctx: GenContext, p: UniformIntParams) -> torch.Tensor:
    """Integers uniform in [low, high): an integer input whose realistic range the axes do not carry, e.g. token
    positions near the end of a 1M-token context (low 900000, high 1000000)."""
    high = p.high if p.high is not None else ctx.axis(p.high_axis or "")
    if high <= p.low:
        raise ctx.fail(f"empty range [{p.low}, {high})")
    flat = torch.randint(p.low, high, (ctx.numel,), generator=ctx.gen, dtype=torch.int64)
    ids = _as_ids(ctx, flat)
    info = torch.iinfo(ctx.dtype)
    if p.low < info.min or high - 1 > info.max:
        raise ctx.fail(f"[{p.low}, {high}) does not fit {ctx.dtype}")
    return ids


def hot_id(ctx: GenContext, p: HotIdParams) -> torch.Tensor:
    high = ctx.axis(p.high_axis)
    ids = _uniform_flat(ctx, high)
    hot = int(torch.randint(0, high, (1,), generator=ctx.gen))
    positions = torch.randperm(ids.numel(), generator=ctx.gen)[: round(p.fraction * ids.numel())]
    ids[positions] = hot
    return _as_ids(ctx, ids)


def padding_heavy(ctx: GenContext, p: PaddingParams) -> torch.Tensor:
    high = ctx.axis(p.high_axis)
    pad = p.pad_value if p.pad_value is not None else int(ctx.earlier(p.pad_from))
    if pad >= high:  # a negative pad is a sentinel such as cross-entropy's ignore_index = -100
        raise ctx.fail(f"pad value {p.pad_from}={pad} is not below {p.high_axis}={high}")
    if p.base == "zipf_ids":
        ids = _zipf_flat(ctx, high, p.s)
    elif p.base == "real_text_ids":
        ids = _real_text_flat(ctx, high)
    else:
        ids = _uniform_flat(ctx, high)
    positions = torch.randperm(ids.numel(), generator=ctx.gen)[: round(p.fraction * ids.numel())]
    ids[positions] = pad
    return _as_ids(ctx, ids)


# --- activations ------------------------------------------------------------


def _as_float(ctx: GenContext, values: torch.Tensor) -> torch.Tensor:
    if ctx.shape is None:
        raise ctx.fail("float generators make tensors; this input is a scalar")
    if not ctx.dtype.is_floating_point:
        raise ctx.fail(f"float generators make floating tensors; this input is {ctx.dtype}")
    return values.reshape(ctx.shape).to(ctx.dtype).cpu()


def normal(ctx: GenContext, p: NormalParams) -> torch.Tensor:
    z = ctx.randn(ctx.numel)
    return _as_float(ctx, z * p.std + p.mean)


def zero_rows(ctx: GenContext, p: ZeroRowsParams) -> torch.Tensor:
    """Normal rows (the last dim is a row) with a fraction of whole rows exactly zero: padding tokens, masked positions."""
    if ctx.shape is None or len(ctx.shape) < 2:
        raise ctx.fail("zero_rows needs a tensor of rank 2 or more")
    width = ctx.shape[-1]
    rows = ctx.numel // max(width, 1)
    z = ctx.randn(rows, width) * p.std
    dead = torch.randperm(rows, generator=ctx.gen)[: max(1, round(p.fraction * rows))]
    z[ctx.here(dead)] = 0.0
    return _as_float(ctx, z)


def offset_rows(ctx: GenContext, p: OffsetRowsParams) -> torch.Tensor:
    """Rows (the last dim) of normal(0, std) noise, each around its own offset: |offset| / std drawn log-uniformly in
    [min_ratio, max_ratio], with a random sign per row. Un-centred activations whose mean dwarfs their spread (a
    large DC component in a residual stream, a feature with a large bias): statistics that cancel, such as a one-pass
    variance E[x^2] - E[x]^2, lose about ratio^2 * u of the variance (u: the unit roundoff they are computed in).
    In a low-precision input dtype a spread below the offset's ulp rounds a row to a few levels (bf16 keeps the
    spread intact up to a ratio of about 2^8); the kernel and the oracle both see those rounded values."""
    if ctx.shape is None or len(ctx.shape) < 1:
        raise ctx.fail("offset_rows needs a tensor")
    width = ctx.shape[-1]
    rows = ctx.numel // max(width, 1)
    lo, hi = math.log(p.min_ratio), math.log(p.max_ratio)
    ratio = torch.exp(lo + (hi - lo) * torch.rand((rows, 1), generator=ctx.gen, dtype=torch.float64))
    sign = torch.where(torch.rand((rows, 1), generator=ctx.gen) < 0.5, -1.0, 1.0).to(torch.float64)
    z = ctx.randn(rows, width)
    return _as_float(ctx, p.std * (z + ctx.here(sign * ratio)))


def positive(ctx: GenContext, p: PositiveParams) -> torch.Tensor:
    z = ctx.randn(ctx.numel)
    return _as_float(ctx, z.abs() * p.scale)


def shared_direction(ctx: GenContext, p: SharedDirectionParams) -> torch.Tensor:
    """Row t = std * (m_t * d[id_t] + noise * z_t): the gradients of one token point one way."""
    ids = ctx.earlier(p.ids_from)
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point:
        raise ctx.fail(f"ids_from '{p.ids_from}' is not an integer tensor")
    flat_ids = ids.reshape(-1).to(torch.int64)
    n = flat_ids.numel()
    if ctx.shape is None or ctx.numel % max(n, 1):
        raise ctx.fail(f"shape {ctx.shape} is not a whole number of rows per id ({n} ids)")
    width = ctx.numel // n
    # one direction per id up to the largest: a vocabulary's worth of normals, drawn where the bulk draws are (on
    # the audit's GPU; drawn on the host in fp64 they took 0.9-1.1 s of an embedding probe stage on the H200)
    directions = ctx.randn(int(flat_ids.max()) + 1, width)
    magnitude = 0.5 + torch.rand((n, 1), generator=ctx.gen, dtype=torch.float64)
    z = ctx.randn(n, width)
    rows = p.std * (ctx.here(magnitude) * directions[ctx.here(flat_ids)] + p.noise * z)
    return _as_float(ctx, rows)


# --- scalars ----------------------------------------------------------------


def _as_scalar(ctx: GenContext, value: int | float | bool) -> Any:
    if ctx.shape is not None:
        return torch.full(ctx.shape, value, dtype=ctx.dtype)
    if ctx.dtype == torch.bool:
        return bool(value)
    if ctx.dtype.is_floating_point:
        return float(value)
    return int(value)


def scalar(ctx: GenContext, p: ScalarParams) -> Any:
    return _as_scalar(ctx, p.value)


def from_axis(ctx: GenContext, p: FromAxisParams) -> Any:
    return _as_scalar(ctx, ctx.axis(p.axis))


@dataclass(frozen=True)
class Generator:
    params: type[_Params]
    make: Callable[[GenContext, Any], Any]


GENERATORS: dict[str, Generator] = {
    "uniform_ids": Generator(IdsParams, uniform_ids),
    "zipf_ids": Generator(ZipfParams, zipf_ids),
    "real_text_ids": Generator(IdsParams, real_text_ids),
    "hot_id": Generator(HotIdParams, hot_id),
    "uniform_int": Generator(UniformIntParams, uniform_int),
    "padding_heavy": Generator(PaddingParams, padding_heavy),
    "normal": Generator(NormalParams, normal),
    "positive": Generator(PositiveParams, positive),
    "zero_rows": Generator(ZeroRowsParams, zero_rows),
    "offset_rows": Generator(OffsetRowsParams, offset_rows),
    "shared_direction": Generator(SharedDirectionParams, shared_direction),
    "scalar": Generator(ScalarParams, scalar),
    "from_axis": Generator(FromAxisParams, from_axis),
}


def generate_input(ctx: GenContext, spec: InputGenerator) -> Any:
    if spec.kind not in GENERATORS:
        raise ctx.fail(f"unknown generator kind '{spec.kind}'; known: {sorted(GENERATORS)}")
    g = GENERATORS[spec.kind]
    try:
        params = g.params.model_validate(spec.params)
    except ValidationError as err:
        raise ctx.fail(f"bad parameters for '{spec.kind}': {err.errors()[0]['loc']} {err.errors()[0]['msg']}") from err
    return g.make(ctx, params)


@dataclass(frozen=True)
class ProbeSources:
    """What a probe may draw on besides its own generators: the benchmark's workloads and the user's ids."""

    reference: ReferenceRunner | None = None
    workloads: tuple[Workload, ...] = ()
    token_stats: LoadedTokenStats | None = None


def _workload_inputs(
    definition: Definition,
    probe: ProbeSpec,
    axes: dict[str, int],
    seed: int,
    sources: ProbeSources,
    device: str = "cpu",
    made: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The inputs the probe does not list, made the way its base workload makes them, at the probe's axes (random
    ones made on `device`, a GPU's generator taking milliseconds where the host's took 16 s for a GEMM's probes,
    then brought to the CPU like every probe input).

    The scalars the probe already `made` replace the base workload's: a custom generator reads them
    (`segment_ids < num_segments`), and the base's value belongs to the base's axes, not the probe's drawn ones."""
    if probe.base_workload is None:
        return {}
    base = next((w for w in sources.workloads if w.uuid == probe.base_workload), None)
    if base is None or sources.reference is None:
        raise ProbeInputError(f"probe '{probe.name}': base workload '{probe.base_workload}' is not available")
    var_axes = {a: axes[a] for a in definition.var_axes}
    scalars = {
        n: ScalarInput(type="scalar", value=v)
        for n, v in (made or {}).items()
        if n in base.inputs and base.inputs[n].type == "scalar"
    }
    probe_workload = base.model_copy(update={"axes": var_axes, "inputs": {**base.inputs, **scalars}})
    try:
        case = build_case(definition, sources.reference, probe_workload, seed, device=device)
    except Exception as err:  # the workload's own generator (custom inputs) rejected these axes
        raise ProbeInputError(f"probe '{probe.name}': workload '{base.uuid}' inputs at axes {var_axes}: {err}") from err
    return {n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in case.inputs.items() if n not in probe.inputs}


def build_probe_case(
    definition: Definition,
    probe: ProbeSpec,
    profile: str,
    seed: int,
    sources: ProbeSources | None = None,
    notes: list[str] | None = None,
    device: str = "cpu",
) -> Case:
    """The probe's inputs at the profile's axes, in the definition's input order (on the CPU; with a GPU `device`,
    large float draws are made there)."""
    sources = sources or ProbeSources()
    try:
        axes = definition.resolve_axes(probe.axes_for(profile))
    except ValueError as err:
        raise ProbeInputError(f"probe '{probe.name}': {err}") from err
    unknown = (set(probe.inputs) | set(probe.noncontiguous)) - set(definition.inputs)
    if unknown:
        raise ProbeInputError(f"probe '{probe.name}': inputs {sorted(unknown)} are not in the definition")
    gen = torch.Generator().manual_seed(seed)
    bulk = torch.Generator(device=device).manual_seed(seed) if device.startswith("cuda") else None
    done: dict[str, Any] = {}

    def context(name: str) -> GenContext:
        spec = definition.inputs[name]
        shape = None if spec.is_scalar else definition.shape_of(spec, axes)
        return GenContext(
            probe.name, name, shape, to_torch(spec.dtype), axes, done, gen, sources.token_stats, notes, bulk
        )

    for name, g in probe.inputs.items():
        done[name] = generate_input(context(name), g)
    done.update(_workload_inputs(definition, probe, axes, seed, sources, device, done))
    for name, spec in definition.inputs.items():
        if name in done:
            continue
        if spec.is_scalar or not to_torch(spec.dtype).is_floating_point:
            raise ProbeInputError(
                f"probe '{probe.name}': input '{name}' ({spec.dtype}) must be listed in the probe's inputs"
            )
        done[name] = normal(context(name), NormalParams())
    inputs = {name: done[name] for name in definition.inputs}
    shapes = {n: definition.shape_of(s, axes) for n, s in definition.outputs.items()}
    return Case(axes=axes, inputs=inputs, output_shapes=shapes)


def permute_case(definition: Definition, case: Case, axis: str, perm: torch.Tensor) -> Case:
    """The same case with every input indexed by `axis` permuted along it by `perm`."""
    inputs = dict(case.inputs)
    for name, spec in definition.inputs.items():
        t = inputs[name]
        if spec.is_scalar or not isinstance(t, torch.Tensor):
            continue
        for dim, a in enumerate(spec.shape or []):
            if a == axis:
                t = t.index_select(dim, perm)
        inputs[name] = t.contiguous()
    return Case(axes=case.axes, inputs=inputs, output_shapes=case.output_shapes)
