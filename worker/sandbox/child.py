"""The untrusted side: imports the submission and serves the parent's requests.

Everything here runs in the submitter's process, so nothing here decides a
verdict: it moves tensors to the device, calls the kernel and sends tensors back.
Usage (by worker.sandbox.runner only): python -m worker.sandbox.child READ_FD WRITE_FD
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from worker.sandbox import framing, spill

# Ops served besides the built-in ones, imported on first use: "module:function".
# Each takes (state, payload) and returns the reply dict.
EXTENSION_OPS: dict[str, str] = {
    "canary_train": "worker.canary.child_ops:train",
}

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


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def op_hello(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    state.device = torch.device(payload.get("device", "cpu"))
    if state.device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=state.device)
    return {"ok": True, "pid": os.getpid(), "torch": str(torch.__version__)}


def op_load(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    root = Path.cwd() / "solution"
    for src in payload["sources"]:
        target = (root / src["path"]).resolve()
        if root.resolve() not in target.parents:
            raise ValueError(f"source path escapes the solution folder: {src['path']}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(src["content"])
    sys.path.insert(0, str(root))
    entry = root / payload["entry_file"]
    spec = importlib.util.spec_from_file_location(Path(payload["entry_file"]).stem, entry)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, payload["entry_function"], None)
    if not callable(fn):
        raise AttributeError(f"entry point '{payload['entry_function']}' is not a function in {payload['entry_file']}")
    state.fn = fn
    state.dps = bool(payload["dps"])
    return {"ok": True}


def _prepare_args(state: HarnessState, payload: dict[str, Any]) -> list[Any]:
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


def _alloc_outputs(state: HarnessState, specs: list[dict[str, Any]], poison: float | None) -> list[torch.Tensor]:
    outs = []
    for s in specs:
        dt = _dtype(s["dtype"])
        t = torch.empty(tuple(s["shape"]), dtype=dt, device=state.device)
        if poison is not None:
            t.fill_(poison if dt.is_floating_point else _POISON_INT if dt != torch.bool else True)
        outs.append(t)
    return outs


def _invoke(state: HarnessState, args: list[Any], outs: list[torch.Tensor]) -> list[Any]:
    assert state.fn is not None, "no solution loaded"
    if state.dps:
        state.fn(*args, *outs)
        return list(outs)
    result = state.fn(*args)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _plain(t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"the kernel returned a {type(t).__name__}, not a torch.Tensor")
    # a tensor subclass could defer work or lie about its values: materialise a plain copy
    return torch.Tensor.as_subclass(t.detach(), torch.Tensor).to("cpu", copy=True).contiguous()


def op_call(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    args = _prepare_args(state, payload)
    outs = _alloc_outputs(state, payload["outputs"], payload.get("poison"))
    results = _invoke(state, args, outs)
    state.sync()
    exact_types = [type(r) is torch.Tensor for r in results]
    return {
        "ok": True,
        "outputs": [_plain(r) for r in results],
        "exact_tensor_types": exact_types,
        "args_after": [_plain(a) if isinstance(a, torch.Tensor) else a for a in args],
    }


def op_time(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    args = _prepare_args(state, payload)
    outs = _alloc_outputs(state, payload["outputs"], None)
    warmup, reps = int(payload["warmup"]), int(payload["reps"])
    times: list[float] = []
    if state.device.type == "cuda":
        event_cls = state.pristine["torch.cuda.Event"]
        flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=state.device)
        for _ in range(warmup):
            _invoke(state, args, outs)
        torch.cuda.synchronize(state.device)
        starts = [event_cls(enable_timing=True) for _ in range(reps)]  # type: ignore[operator]
        ends = [event_cls(enable_timing=True) for _ in range(reps)]  # type: ignore[operator]
        host: list[float] = []
        for i in range(reps):
            if payload.get("flush_l2", True):
                flush.zero_()
            h0 = state.perf_counter()
            starts[i].record()
            _invoke(state, args, outs)
            ends[i].record()
            host.append((state.perf_counter() - h0) * 1e3)  # time the host spent issuing the call
        torch.cuda.synchronize(state.device)
        elapsed = state.pristine["torch.cuda.Event.elapsed_time"]
        times = [float(elapsed(s, e)) for s, e in zip(starts, ends)]  # type: ignore[operator]
        return {"ok": True, "times_ms": times, "host_times_ms": host, "clock": "cuda_events", "tampered": state.tampered()}
    else:
        for _ in range(warmup):
            _invoke(state, args, outs)
        for _ in range(reps):
            t0 = state.perf_counter()
            _invoke(state, args, outs)
            times.append((state.perf_counter() - t0) * 1e3)
        return {"ok": True, "times_ms": times, "clock": "wall_clock_cpu", "tampered": state.tampered()}


BUILTIN_OPS: dict[str, Callable[[HarnessState, dict[str, Any]], dict[str, Any]]] = {
    "hello": op_hello,
    "load": op_load,
    "call": op_call,
    "time": op_time,
}


def _resolve(op: str) -> Callable[[HarnessState, dict[str, Any]], dict[str, Any]]:
    if op in BUILTIN_OPS:
        return BUILTIN_OPS[op]
    if op in EXTENSION_OPS:
        module, func = EXTENSION_OPS[op].split(":")
        return getattr(importlib.import_module(module), func)  # type: ignore[no-any-return]
    raise KeyError(op)


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    state = HarnessState()
    while True:
        try:
            msg = framing.read_frame(read_fd)
        except EOFError:
            return
        op = msg.pop("op", "")
        nonce = msg.pop("nonce", "")
        spill_dir = Path.cwd() / spill.FOLDER
        try:
            handler = _resolve(op)
        except KeyError:
            framing.write_frame(write_fd, {"ok": False, "kind": "harness", "error": f"unknown op '{op}'", "nonce": nonce})
            continue
        try:
            reply = handler(state, spill.unspill_message(spill_dir, msg, copy=False))
            reply, _ = spill.spill_message(spill_dir, reply, nonce)
        except BaseException as err:  # noqa: BLE001 - everything the submission raises goes back as data
            if isinstance(err, KeyboardInterrupt):
                raise
            framing.write_frame(
                write_fd,
                {
                    "ok": False,
                    "kind": "submission",
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()[-4000:],
                    "nonce": nonce,
                },
            )
            continue
        framing.write_frame(write_fd, {**reply, "nonce": nonce})


if __name__ == "__main__":
    main()
