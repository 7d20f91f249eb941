"""The generic oracle: the definition's own reference, run with every float promoted to fp64.

Runs in the trusted process under a TorchFunctionMode that
  - promotes every floating tensor argument to fp64,
  - rewrites floating dtype arguments (`dtype=torch.bfloat16`, `.to(torch.float32)`, `.type(...)`)
    and the casts `.float()`, `.half()`, `.bfloat16()` to fp64,
  - re-runs a factory call that made a lower-precision float without a dtype (`torch.zeros(n)`)
    with `dtype=torch.float64`,
  - and records any op that still returned a lower-precision float (upcast after the fact: the
    promotion is then partial, and the report says so).
Bit reinterpretation (`.view(dtype)`) is left alone. If the promoted run raises, the reference is run
at fp32 promotion, then at its own precision, and the report names what was used and why.

On a GPU audit a trusted reference runs on the GPU (fp64 there is the same arithmetic, and a GEMM's fp64
oracle takes milliseconds instead of seconds on the host), except where its result could depend on the
device: a reference that selects by order (top-k, sort, arg-max, ...) breaks ties differently on CUDA than
on the CPU, so once such a call is seen the oracle reruns, and stays, on the CPU. Running out of GPU memory
moves it to the CPU too, never to a lower precision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from torch.overrides import TorchFunctionMode

from worker.numerics.placement import CPU, on_device_or_cpu
from worker.reference import Reference

Precision = Literal["fp64", "fp32", "reference"]
_CASTS = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.double}
_DTYPE_POSITIONAL = {torch.Tensor.to, torch.Tensor.type}
_NO_REWRITE = {torch.Tensor.view}
# calls whose result depends on how ties are broken, which differs between CUDA and the CPU
_SELECTIONS = {
    torch.topk,
    torch.Tensor.topk,
    torch.sort,
    torch.Tensor.sort,
    torch.argsort,
    torch.Tensor.argsort,
    torch.msort,
    torch.argmax,
    torch.Tensor.argmax,
    torch.argmin,
    torch.Tensor.argmin,
    torch.kthvalue,
    torch.Tensor.kthvalue,
    torch.max,
    torch.Tensor.max,
    torch.min,
    torch.Tensor.min,
    torch.median,
    torch.Tensor.median,
    torch.nanmedian,
    torch.Tensor.nanmedian,
    torch.mode,
    torch.Tensor.mode,
    torch.unique,
    torch.Tensor.unique,
    torch.searchsorted,
    torch.multinomial,
    torch.Tensor.multinomial,
}


def _promote_value(value: Any, target: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point and value.dtype != target:
        return value.to(target)
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return target
    return value


def _has_tensor(values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in values)


class _Promote(TorchFunctionMode):
    """Keep a reference's floating computation at `target` precision (see the module docstring)."""

    def __init__(self, target: torch.dtype, device: torch.device | None = None) -> None:
        super().__init__()
        self.target = target
        self.device = device  # where a factory call without a device makes its tensor (the oracle's device)
        self.lowered: dict[str, int] = {}
        self.selects = False

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _SELECTIONS:
            self.selects = True
        if func in _NO_REWRITE:
            return func(*args, **kwargs)
        if func in _CASTS:
            return args[0].to(self.target)
        t = self.target
        args = tuple(
            _promote_value(a, t) if (not isinstance(a, torch.dtype) or func in _DTYPE_POSITIONAL) else a for a in args
        )
        had_dtype = "dtype" in kwargs
        kwargs = {k: _promote_value(v, t) for k, v in kwargs.items()}
        if (
            self.device is not None
            and "device" not in kwargs
            and not _has_tensor(args)
            and not _has_tensor(kwargs.values())
        ):
            try:  # a factory (torch.zeros(n), torch.arange(n)) makes its tensor on the oracle's device
                result = func(*args, **kwargs, device=self.device)
            except TypeError:
                result = func(*args, **kwargs)
        else:
            result = func(*args, **kwargs)
        if isinstance(result, torch.Tensor) and result.dtype.is_floating_point and result.dtype != t:
            if not had_dtype and not _has_tensor(args) and not _has_tensor(kwargs.values()):
                try:  # a factory without a dtype made the default float: make it at the target instead
                    where = {"device": self.device} if self.device is not None and "device" not in kwargs else {}
                    return func(*args, **kwargs, **where, dtype=t)
                except TypeError:
                    pass
            label = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
            self.lowered[label] = self.lowered.get(label, 0) + 1
            return result.to(t)
        return result


class OracleRun(BaseModel):
    """How the generic oracle got its result."""

    precision: Precision
    note: str
    partial: dict[str, int] = Field(
        default_factory=dict, description="ops that still returned a lower float (upcast after)"
    )
    fallback_reason: str | None = None
    device: str = "cpu"


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def run_promoted(
    fn: Callable[..., Any],
    args: list[Any],
    target: torch.dtype,
    device: torch.device | None = None,
) -> tuple[list[Any], dict[str, int], bool]:
    """`fn(*args)` with floats promoted to `target` (and factories on `device` where given); returns the outputs,
    the ops that were not promoted, and whether the function selected by order (see _SELECTIONS)."""
    mode = _Promote(target, device)
    promoted = [_promote_value(a.clone(), target) if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad(), mode:
        outs = _outputs(fn(*promoted))
    return outs, dict(mode.lowered), mode.selects


class _Rerun(Exception):
    """The device run cannot stand: run on the CPU instead (from now on, when `sticky`)."""

    def __init__(self, sticky: bool) -> None:
        super().__init__()
        self.sticky = sticky


class GenericOracle:
    """The reference as an oracle: fp64 where promotion works, with the fallbacks recorded per call."""

    def __init__(self, reference: Reference, device: str = "cpu") -> None:
        self.reference = reference
        self.runs: list[OracleRun] = []
        trusted = getattr(reference, "trusted", True)
        # where this oracle may run: the audit's GPU for a trusted reference until it selects by order
        self.device = torch.device(device) if trusted and str(device).startswith("cuda") else CPU

    @property
    def last_promoted(self) -> bool:
        """Whether the last call computed at a wider precision than the reference's own: its result is then the
        ideal, and honest implementations are measured against it; otherwise it is itself only rounded."""
        return not (self.runs and self.runs[-1].precision == "reference")

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        outs, run = self.evaluate(list(args))
        self.runs.append(run)
        return tuple(outs)

    def evaluate(self, args: list[Any]) -> tuple[list[Any], OracleRun]:
        """The promoted outputs, on the oracle's device (see the module docstring); the arguments stay as given."""
        try:
            return on_device_or_cpu(self.device, lambda device: self._evaluate(args, device))
        except _Rerun as rerun:
            if rerun.sticky:
                self.device = CPU
            return self._evaluate(args, CPU)

    def _evaluate(self, args: list[Any], device: torch.device) -> tuple[list[Any], OracleRun]:
        on_device = device.type == "cuda"
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        fn = self.reference.run_fn
        reasons: list[str] = []
        where = str(device)
        for precision, target in (("fp64", torch.float64), ("fp32", torch.float32)):
            try:
                outs, lowered, selects = run_promoted(fn, args, target, device if on_device else None)
            except torch.OutOfMemoryError:
                raise
            except Exception as err:  # the reference's own failure under promotion is reported
                if on_device:  # the CPU run gives the reference's own error, or its result
                    raise _Rerun(sticky=False) from err
                reasons.append(f"{precision} promotion raised {type(err).__name__}: {str(err)[:200]}")
                continue
            if on_device and selects:
                raise _Rerun(sticky=True)
            bad = [i for i, o in enumerate(outs) if not isinstance(o, torch.Tensor)]
            if bad:
                reasons.append(f"{precision} promotion returned non-tensor outputs at {bad}")
                continue
            note = f"the definition's reference with inputs and float constants promoted to {precision}"
            if not getattr(self.reference, "trusted", True):
                note = (
                    f"the uploaded reference, isolated in its own sandbox, fed inputs promoted to {precision} "
                    "(casts inside it are not promoted)"
                )
            if lowered:
                note += (
                    f"; partial: {sum(lowered.values())} op(s) still computed below {precision} and were upcast after"
                )
            return outs, OracleRun(
                precision=precision,  # type: ignore[arg-type]
                note=note,
                partial=lowered,
                fallback_reason="; ".join(reasons) or None,
                device=where,
            )
        with torch.no_grad():
            outs = _outputs(fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
        return outs, OracleRun(
            precision="reference",
            note="promotion failed; the oracle is the reference at its own precision, and budgets are relative to it",
            fallback_reason="; ".join(reasons),
            device=where,
        )

    def summary(self) -> dict[str, Any]:
        """The weakest run so far (what the report must admit to)."""
        order = {"fp64": 0, "fp32": 1, "reference": 2}
        if not self.runs:
            return {"precision": None, "note": "the oracle did not run"}
        worst = max(self.runs, key=lambda r: (order[r.precision], len(r.partial)))
        return {**worst.model_dump(exclude_none=True), "calls": len(self.runs)}
