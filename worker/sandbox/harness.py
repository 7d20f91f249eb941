"""The harness state inside the sandbox child: the loaded entry point, its device, trusted timer copies,
and how the kernel is called (arguments placed, outputs allocated and poisoned, destination-passing or not).

Used by the child's ops (worker.sandbox.child) and by ops of other packages served there (the canary's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

_POISON_INT = -(2**31) + 7


class HarnessState:
    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.fn: Callable[..., Any] | None = None
        self.dps = True
        # trusted references to the timers, taken before any submission code runs
        self.perf_counter = time.perf_counter
        self.pristine: dict[str, object] = {
            "time.perf_counter": time.perf_counter,
            "torch.cuda.Event": torch.cuda.Event,
            "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
            "torch.cuda.Event.record": torch.cuda.Event.record,
            "torch.cuda.synchronize": torch.cuda.synchronize,
            "torch.allclose": torch.allclose,
            "torch.testing.assert_close": torch.testing.assert_close,
        }

    def tampered(self) -> list[str]:
        now = {
            "time.perf_counter": time.perf_counter,
            "torch.cuda.Event": torch.cuda.Event,
            "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
            "torch.cuda.Event.record": torch.cuda.Event.record,
            "torch.cuda.synchronize": torch.cuda.synchronize,
            "torch.allclose": torch.allclose,
            "torch.testing.assert_close": torch.testing.assert_close,
        }
        return [k for k, v in self.pristine.items() if now[k] is not v]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def prepare_args(state: HarnessState, payload: dict[str, Any]) -> list[Any]:
    noncontig = set(payload.get("noncontiguous", []))
    args = []
    for i, a in enumerate(payload["args"]):
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


def alloc_outputs(state: HarnessState, specs: list[dict[str, Any]], poison: float | None) -> list[torch.Tensor]:
    outs = []
    for s in specs:
        dt = dtype_of(s["dtype"])
        t = torch.empty(tuple(s["shape"]), dtype=dt, device=state.device)
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


