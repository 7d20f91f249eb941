"""The untrusted side: imports the submission and serves the parent's requests.

Everything here runs in the submitter's process, so nothing here decides a
verdict: it moves tensors to the device, calls the kernel and sends tensors back.
Usage (by worker.sandbox.runner only): python -m worker.sandbox.child READ_FD WRITE_FD [SHARE_FD]
(SHARE_FD: a Unix socket on which device outputs' file descriptors go to the parent, see
worker.sandbox.device_share)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from worker import generated
from worker.canary import child_ops as canary_ops
from worker.numerics import timing
from worker.sandbox import device_share, framing, harness, spill
from worker.sandbox.harness import HarnessState

IMPORT_WAIT_S = 60.0  # the parent sends a request's fds before its frame: they are there when the frame is


def op_hello(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    state.device = torch.device(payload.get("device", "cpu"))
    shared = False
    if state.device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=state.device)
        if payload.get("device_share"):
            try:
                state.exporter = device_share.Exporter(state.device)
                shared = True
            except Exception:  # noqa: BLE001 - no export here: outputs go through the host, as before
                state.exporter = None
    return {"ok": True, "pid": os.getpid(), "torch": str(torch.__version__), "device_share": shared}


def op_warm(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    """Before any submission is loaded (the parent refuses it afterwards): worker.canary.warm."""
    if state.fn is not None:
        raise RuntimeError("warm-up runs only before a submission is loaded")
    from worker.canary.warm import warm_up

    return {"ok": True, "seconds": warm_up(state.device, int(payload.get("steps", 2)))}


def op_load(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    root = Path.cwd() / "solution"
    written: set[Path] = set()
    for src in payload["sources"]:
        path = src["path"]
        # the parent sends the canonical paths the static stage scanned; any other spelling ('k.py/', './k.py')
        # or a second file at one path would write over a scanned file, so it is refused rather than written
        if not isinstance(path, str) or not path or str(PurePosixPath(path)) != path or path.startswith("/") or "\\" in path:
            raise ValueError(f"source path is not in canonical form: {path!r}")
        target = (root / path).resolve()
        if root.resolve() not in target.parents:
            raise ValueError(f"source path escapes the solution folder: {path}")
        if target in written:
            raise ValueError(f"two sources name one file: {path}")
        written.add(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(src["content"])
    sys.path.insert(0, str(root))
    artifact = payload.get("artifact")
    if artifact is not None:  # a C++ solution: its built extension, exactly the bytes the build produced
        from worker.build.loader import load_extension

        so = root / "benchmark_kernel.so"
        so.write_bytes(artifact["data"])
        state.fn = load_extension(so, str(artifact["sha256"]), str(artifact["entry_symbol"]))
        state.module = None
        state.dps = bool(payload["dps"])
        return {"ok": True}
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
    state.module = module
    state.dps = bool(payload["dps"])
    return {"ok": True}


def op_custom_inputs(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    """An uploaded definition's `custom_inputs_entrypoint`, called here like its reference: its inputs come back
    as tensors only (the parent reads them weights-only)."""
    if state.module is None:
        raise RuntimeError("no module loaded")
    fn = getattr(state.module, str(payload["entrypoint"]), None)
    if not callable(fn):
        raise AttributeError(f"custom inputs entry point '{payload['entrypoint']}' is not a function")
    torch.manual_seed(int(payload["seed"]))
    made = fn(dict(payload["axes_and_scalars"]), torch.device("cpu"))
    if not isinstance(made, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in made.items()):
        raise TypeError("custom inputs must be a dict of input name -> torch.Tensor")
    return {"ok": True, "inputs": {k: _plain(v) for k, v in made.items()}}


def _plain(t: Any, state: HarnessState | None = None) -> torch.Tensor:
    """A plain tensor of the kernel's output: on the host, or, where the parent takes device outputs
    (`state.exporter`), still on the device (the reply's export copies it, see worker.sandbox.device_share)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"the kernel returned a {type(t).__name__}, not a torch.Tensor")
    # a tensor subclass could defer work or lie about its values: materialise a plain copy
    plain = torch.Tensor.as_subclass(t.detach(), torch.Tensor)
    if state is not None and state.exporter is not None and plain.device.type == "cuda":
        return plain.contiguous()
    return plain.to("cpu", copy=True).contiguous()


def op_call(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    args = harness.prepare_args(state, payload)
    # inputs made here from recipes go back as digests, before (what was made) and after the call (mutation)
    made = [i for i, a in enumerate(payload["args"]) if generated.is_wire(a)]
    made_digests = {i: generated.digest(args[i]) for i in made}
    outs = harness.alloc_outputs(state, payload["outputs"], payload.get("poison"))
    style = payload.get("reorder")
    if style is not None:  # an uploaded reference re-run with its reductions in another honest order
        from worker.numerics.reorder import STYLES, Reorder

        if style not in STYLES:
            raise ValueError(f"unknown reorder style {style!r}")
        with Reorder(style):
            results = harness.invoke(state, args, outs)
    else:
        results = harness.invoke(state, args, outs)
    state.sync()
    exact_types = [type(r) is torch.Tensor for r in results]
    # `digest_after`: every tensor input comes back as a digest, not a copy (the parent compares it with its own)
    digest_all = bool(payload.get("digest_after"))
    after = [generated.digest_wire(a) if i in made_digests or (digest_all and isinstance(a, torch.Tensor))
             else _plain(a) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    return {
        "ok": True,
        "tampered": state.tampered(),
        "outputs": [_plain(r, state) for r in results],
        "exact_tensor_types": exact_types,
        "args_after": after,
        "made_digests": [made_digests[i] for i in made],
    }


def op_time(state: HarnessState, payload: dict[str, Any]) -> dict[str, Any]:
    """`reps` timed calls, call i on its own input set (`args` holds them one after another, `n_args` each; one
    more, if sent, is the warm-up calls') into fresh poisoned outputs; the outputs of the calls listed in
    `check` go back for the parent to judge."""
    flat = payload["args"]
    # without `n_args` all of `args` is one input set, reused by every call (the GPU measurement scripts' way)
    n_args = int(payload.get("n_args", len(flat)))
    # every input set is made (recipes) or placed on the device before the first timed call
    cases = [harness.prepare_args(state, {"args": flat[i:i + n_args], "noncontiguous": payload.get("noncontiguous", [])})
             for i in range(0, len(flat), n_args)] if n_args else [[]]
    check = {int(i) for i in payload.get("check", [])}
    # the checked calls' inputs made here from recipes, as digests (the parent compares them with its own)
    made_digests = [[generated.digest(cases[c][j]) for j in range(n_args) if generated.is_wire(flat[c * n_args + j])]
                    for c in sorted(check) if n_args and c < len(cases)]
    cfg = timing.TimingConfig(warmup=int(payload["warmup"]), reps=int(payload["reps"]),
                              flush_l2=bool(payload.get("flush_l2", True)))
    if 1 < len(cases) < cfg.reps:
        raise ValueError(f"{cfg.reps} timed calls need as many input sets, got {len(cases)}")
    # warm-up calls run on an input set of their own when one is given (so no timed call repeats one)
    spare = cases[cfg.reps] if len(cases) > cfg.reps else cases[0]
    current: list[list[torch.Tensor]] = [[]]
    kept: dict[int, list[Any]] = {}

    def prepare(i: int) -> None:
        current[0] = harness.alloc_outputs(state, payload["outputs"], payload.get("poison"))

    def call(i: int) -> None:
        results = harness.invoke(state, spare if i < 0 else cases[i] if len(cases) > 1 else cases[0], current[0])
        if i in check:
            kept[i] = results

    sample = timing.measure(call, state.device, cfg, prepare=prepare, clock=state.perf_counter,
                            event=state.pristine["torch.cuda.Event"], elapsed=state.pristine["torch.cuda.Event.elapsed_time"])
    outputs = [_plain(r, state) for i in sorted(kept) for r in kept[i]]
    return {"ok": True, **sample.model_dump(exclude_none=True), "outputs": outputs, "checked": sorted(kept),
            "tampered": state.tampered(), "made_digests": made_digests}


# every op the child serves: name -> (state, payload) -> reply
OPS: dict[str, Callable[[HarnessState, dict[str, Any]], dict[str, Any]]] = {
    "hello": op_hello,
    "warm": op_warm,
    "load": op_load,
    "call": op_call,
    "custom_inputs": op_custom_inputs,
    "time": op_time,
    "canary_train": canary_ops.train,
}


def _take_device_inputs(share: socket.socket | None, msg: dict[str, Any], nonce: str, state: HarnessState) -> dict[str, Any]:
    """The request's large inputs the parent exported on the device (worker.sandbox.device_share), copied into this
    process's own tensors. The driver running out of memory is reported as the device's, not as the kernel's fault."""
    try:
        return device_share.receive_message(share, msg, nonce, str(state.device), time.monotonic() + IMPORT_WAIT_S,
                                            device_share.INPUT_KEYS)
    except device_share.DeviceShareOutOfMemory as err:
        raise torch.OutOfMemoryError(f"taking the request's inputs: {err}") from err


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    share = socket.socket(fileno=int(sys.argv[3])) if len(sys.argv) > 3 else None
    state = HarnessState(OPS)
    spill_dir = spill.open_folder(Path.cwd() / spill.FOLDER)
    while True:
        try:
            msg = framing.read_frame(read_fd)
        except EOFError:
            return
        op = msg.pop("op", "")
        nonce = msg.pop("nonce", "")
        try:
            handler = OPS[op]
        except KeyError:
            framing.write_frame(write_fd, {"ok": False, "kind": "harness", "error": f"unknown op '{op}'", "nonce": nonce})
            continue
        if state.exporter is not None:
            state.exporter.release()  # the parent copied the last reply's device outputs before this request
        try:
            msg = _take_device_inputs(share, msg, nonce, state)
            reply = handler(state, spill.unspill_message(spill_dir, msg, copy=False))
            if state.exporter is not None and share is not None:
                reply, fds = state.exporter.share_message(reply)
                device_share.send_fds(share, nonce, fds)
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
