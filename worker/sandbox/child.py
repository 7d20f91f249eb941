"""The untrusted side: imports the submission and serves the parent's requests.

Everything here runs in the submitter's process, so nothing here decides a verdict. This module is the loop: read a
request frame, validate it against its op's request model (worker.sandbox.protocol), run the op's handler (the ones
registered by worker.sandbox.registry.OP_MODULES, imported before any submission code runs) and write its reply.
Usage (by worker.sandbox.runner only): python -m worker.sandbox.child READ_FD WRITE_FD [SHARE_FD]
(SHARE_FD: a Unix socket on which device outputs' file descriptors go to the parent, see
worker.sandbox.device_share)
"""

from __future__ import annotations

import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from worker.sandbox import device_share, framing, protocol, registry, spill
from worker.sandbox.harness import HarnessState

IMPORT_WAIT_S = 60.0  # the parent sends a request's fds before its frame: they are there when the frame is

# every op the child serves: name -> handler, filled by registry.load_ops() in main(). A submission that replaces a
# handler here is reported by HarnessState.tampered (a tripwire: see worker.sandbox.harness)
OPS = registry.HANDLERS


def _take_device_inputs(
    share: socket.socket | None, msg: dict[str, Any], nonce: str, state: HarnessState
) -> dict[str, Any]:
    """The request's large inputs the parent exported on the device (worker.sandbox.device_share), copied into this
    process's own tensors. The driver running out of memory is reported as the device's, not as the kernel's fault."""
    try:
        return device_share.receive_message(
            share, msg, nonce, str(state.device), time.monotonic() + IMPORT_WAIT_S, device_share.INPUT_KEYS
        )
    except device_share.DeviceShareOutOfMemory as err:
        raise torch.OutOfMemoryError(f"taking the request's inputs: {err}") from err


def _error(write_fd: int, nonce: str, kind: str, message: str, trace: str = "") -> None:
    framing.write_frame(write_fd, {"ok": False, "kind": kind, "error": message, "traceback": trace, "nonce": nonce})


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    share = socket.socket(fileno=int(sys.argv[3])) if len(sys.argv) > 3 else None
    registry.load_ops()
    state = HarnessState(OPS)
    spill_dir = spill.open_folder(Path.cwd() / spill.FOLDER)
    while True:
        try:
            msg = framing.read_frame(read_fd)
        except EOFError:
            return
        op = msg.pop("op", "")
        nonce = msg.pop("nonce", "")
        handler = OPS.get(op) if isinstance(op, str) else None
        model = protocol.REQUESTS.get(op) if isinstance(op, str) else None
        if handler is None or model is None:
            _error(write_fd, nonce, "harness", f"unknown op {op!r}")
            continue
        if state.exporter is not None:
            state.exporter.release()  # the parent copied the last reply's device outputs before this request
        try:
            # the request's fds are taken even when it turns out malformed: left in the socket they would be read
            # as the next request's
            msg = spill.unspill_message(spill_dir, _take_device_inputs(share, msg, nonce, state), copy=False)
            request = protocol.parse(model, msg, f"'{op}' request")
        except protocol.MalformedMessage as err:
            _error(write_fd, nonce, "harness", str(err))
            continue
        except BaseException as err:  # taking the inputs failed (the device is full): as data
            if isinstance(err, KeyboardInterrupt):
                raise
            _error(write_fd, nonce, "submission", f"{type(err).__name__}: {err}", traceback.format_exc()[-4000:])
            continue
        try:
            served = handler(state, request)
            if not isinstance(served, model.reply_type):
                raise TypeError(
                    f"the '{op}' handler returned a {type(served).__name__}, not a {model.reply_type.__name__}"
                )
            reply = served.wire()
            if state.exporter is not None and share is not None:
                reply, fds = state.exporter.share_message(reply)
                device_share.send_fds(share, nonce, fds)
            reply, _ = spill.spill_message(spill_dir, reply, nonce)
        except BaseException as err:  # everything the submission raises goes back as data
            if isinstance(err, KeyboardInterrupt):
                raise
            _error(write_fd, nonce, "submission", f"{type(err).__name__}: {err}", traceback.format_exc()[-4000:])
            continue
        framing.write_frame(write_fd, {"ok": True, **reply, "nonce": nonce})


if __name__ == "__main__":
    main()
