"""Length-prefixed frames of torch.save'd dicts over a pipe.

The parent reads with weights_only=True: the child can only hand back tensors,
numbers, strings and containers of them, never objects that run code on load.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable
from typing import Any

import torch

_HEADER = struct.Struct("!Q")
MAX_FRAME = 8 * 1024**3


def encode(message: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(message, buf)
    data = buf.getvalue()
    return _HEADER.pack(len(data)) + data


def write_frame(fd: int, message: dict[str, Any]) -> None:
    data = memoryview(encode(message))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def read_exact(fd: int, n: int, wait: Callable[[], None] | None = None) -> bytes:
    """Read n bytes; `wait` (if given) runs before each read and raises when the deadline has passed."""
    chunks = []
    while n:
        if wait is not None:
            wait()
        chunk = os.read(fd, min(n, 1 << 24))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def decode(payload: bytes) -> dict[str, Any]:
    obj = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    if not isinstance(obj, dict):
        raise ValueError("frame is not a dict")
    return obj


def read_frame(fd: int, wait: Callable[[], None] | None = None) -> dict[str, Any]:
    (n,) = _HEADER.unpack(read_exact(fd, _HEADER.size, wait))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the limit")
    return decode(read_exact(fd, n, wait))
