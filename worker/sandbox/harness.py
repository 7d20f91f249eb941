"""The harness state inside the sandbox child: the loaded entry point, its device, trusted timer copies,
and how the kernel is called (arguments placed, outputs allocated and poisoned, destination-passing or not).

Used by the child's ops (worker.sandbox.ops) and by ops of other packages served there (the canary's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from worker import generated
from worker.numerics import timing
from worker.sandbox.interpreter_bf16 import Bf16Watch
from worker.sandbox.protocol import OutputSpec

_POISON_INT = -(2**31) + 7


def _watched() -> dict[str, object]:
    """The timer, checker and harness functions a forger would replace, as they are now."""
    return {
        "time.perf_counter": time.perf_counter,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.allclose": torch.allclose,
        "torch.testing.assert_close": torch.testing.assert_close,
        "worker.numerics.timing.measure": timing.measure,
        "worker.sandbox.harness.invoke": invoke,
        "worker.sandbox.harness.alloc_outputs": alloc_outputs,
    }


class HarnessState:
    """`ops`: the child's op table; a replaced handler (or a handler whose code was swapped) counts as tampering.

    A tripwire, not a wall: the submission can rewrite this check too. The walls are the parent's
    own clock (CPU), its checks of timed outputs and the bandwidth floor (see worker.numerics.timing)."""

    def __init__(self, ops: dict[str, Callable[..., Any]] | None = None) -> None:
        self.device = torch.device("cpu")
        self.fn: Callable[..., Any] | None = None
        # the loaded module, for ops that call another of its functions (an uploaded reference's custom inputs)
        self.module: Any = None
        self.dps = True
        # set by 'hello' when the parent takes device outputs as exported CUDA memory (worker.sandbox.device_share)
        self.exporter: Any = None
        # set by 'load' for a Triton solution on the CPU (worker.sandbox.interpreter_bf16)
        self.bf16_watch: Bf16Watch | None = None
        # trusted references to the timers, taken before any submission code runs
        self.perf_counter = time.perf_counter
        self.pristine: dict[str, object] = _watched()
        self._ops = ops if ops is not None else {}
        self._ops_pristine = {k: (v, getattr(v, "__code__", None)) for k, v in self._ops.items()}

    def tampered(self) -> list[str]:
        now = _watched()
        out = [k for k, v in self.pristine.items() if now[k] is not v]
        for name, (fn, code) in self._ops_pristine.items():
            current = self._ops.get(name)
            if current is not fn or getattr(current, "__code__", None) is not code:
                out.append(f"child op '{name}'")
        return out

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def prepare_args(state: HarnessState, wire_args: Sequence[Any], noncontiguous: Sequence[int] = ()) -> list[Any]:
    """The request's arguments on the child's device: recipes made, tensors moved, those at `noncontiguous` strided."""
    noncontig = set(noncontiguous)
    args = []
    for i, a in enumerate(wire_args):
        if generated.is_wire(a):  # a random input made here from its recipe (worker.generated)
            a = generated.from_wire(a, state.device)
        if isinstance(a, torch.Tensor):
            t = a.to(state.device)
            if i in noncontig and t.dim() >= 1:
                # same values, strided storage: every other element of a wider buffer
                wide = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
                wide[..., ::2] = t
                t = wide[..., ::2]
            args.append(t)
        else:
            args.append(a)
    return args


def alloc_outputs(state: HarnessState, specs: Sequence[OutputSpec], poison: float | None) -> list[torch.Tensor]:
    outs = []
    for s in specs:
        dt = dtype_of(s.dtype)
        t = torch.empty(tuple(s.shape), dtype=dt, device=state.device)
        if poison is not None:
            t.fill_(poison if dt.is_floating_point else _POISON_INT if dt != torch.bool else True)
        outs.append(t)
    return outs


def invoke(state: HarnessState, args: list[Any], outs: list[torch.Tensor]) -> list[Any]:
    assert state.fn is not None, "no solution loaded"
    if state.dps:
        state.fn(*args, *outs)
        return list(outs)
    result = state.fn(*args)
    return list(result) if isinstance(result, (tuple, list)) else [result]
