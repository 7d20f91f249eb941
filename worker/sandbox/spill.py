"""Large tensors cross the trust boundary as files in the sandbox's own folder, not through the pipe.

A 1 GB logits tensor through the pipe is copied six times (save, frame, write, read, join,
load); as a file it is written once and read once, and the child maps its inputs without a
copy. Only the top-level lists `args` (parent to child), `outputs` and `args_after` (child to
parent) are spilled; every other value still travels in the frame. A spilled tensor is
replaced by a small descriptor: {"__spill__": file name, "dtype": name, "shape": [...]}.

The files give the submission no power it lacks: what it could write into one it could
return as an output. The parent treats the child's files as hostile input: the name must be a plain name in the
spill folder, the dtype one of a fixed set, the size exact, symbolic links refused, and the
bytes are copied out at once (the child could change the file later).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

SPILL_BYTES = 1 << 20  # tensors at least this large go through files
FOLDER = "spill"  # inside the sandbox's home, which the child may write anyway
SPILLED_KEYS = ("args", "outputs", "args_after")
_NAME = re.compile(r"^[a-z]+-[0-9a-f]{1,32}-[0-9]{1,6}\.bin$")
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}


class SpillError(ValueError):
    """A descriptor or spill file that does not describe what it claims."""


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _bytes_of(t: torch.Tensor) -> memoryview:
    flat = t.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def write(folder: Path, name: str, t: torch.Tensor) -> dict[str, Any]:
    """Write a CPU tensor's bytes to folder/name and return its descriptor."""
    dtype = _dtype_name(t)
    if dtype not in _DTYPES:
        raise SpillError(f"cannot spill a {t.dtype} tensor")
    with open(folder / name, "wb") as f:
        f.write(_bytes_of(t))
    return {"__spill__": name, "dtype": dtype, "shape": list(t.shape)}


def is_descriptor(value: object) -> bool:
    return isinstance(value, dict) and "__spill__" in value


def _checked(folder: Path, d: dict[str, Any]) -> tuple[Path, torch.dtype, list[int], int]:
    name, dtype_name, shape = d.get("__spill__"), d.get("dtype"), d.get("shape")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpillError(f"bad spill file name {name!r}")
    if dtype_name not in _DTYPES:
        raise SpillError(f"bad spill dtype {dtype_name!r}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise SpillError(f"bad spill shape {shape!r}")
    dtype = _DTYPES[dtype_name]
    numel = 1
    for n in shape:
        numel *= n
    return folder / name, dtype, shape, numel * dtype.itemsize


def read_copy(folder: Path, d: dict[str, Any]) -> torch.Tensor:
    """Parent side: a private copy of a tensor the child spilled, checked against its descriptor."""
    path, dtype, shape, nbytes = _checked(folder, d)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size != nbytes:
            raise SpillError(f"spill file {path.name} holds {os.fstat(fd).st_size} bytes, its descriptor says {nbytes}")
        out = torch.empty(shape, dtype=dtype)
        if nbytes:
            view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
            got = 0
            while got < nbytes:
                n = os.readv(fd, [view[got:]])
                if n <= 0:
                    raise SpillError(f"spill file {path.name} ended early")
                got += n
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return out


def map_input(folder: Path, d: dict[str, Any]) -> torch.Tensor:
    """Child side: the parent's input, mapped from its file without a copy."""
    path, dtype, shape, nbytes = _checked(folder, d)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    numel = nbytes // dtype.itemsize
    return torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(shape)


def spill_message(folder: Path, message: dict[str, Any], tag: str) -> tuple[dict[str, Any], list[Path]]:
    """Replace the large tensors of the spilled keys by descriptors; returns the files written."""
    out = dict(message)
    written: list[Path] = []
    for key in SPILLED_KEYS:
        values = message.get(key)
        if not isinstance(values, list):
            continue
        new = []
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.nbytes >= SPILL_BYTES and _dtype_name(v) in _DTYPES:
                name = f"{key.replace('_', '')}-{tag}-{i}.bin"
                new.append(write(folder, name, v))
                written.append(folder / name)
            else:
                new.append(v)
        out[key] = new
    return out, written


def unspill_message(folder: Path, message: dict[str, Any], *, copy: bool) -> dict[str, Any]:
    """Replace descriptors by tensors: private copies (parent) or mappings (child)."""
    out = dict(message)
    for key in SPILLED_KEYS:
        values = message.get(key)
        if isinstance(values, list) and any(is_descriptor(v) for v in values):
            out[key] = [(read_copy(folder, v) if copy else map_input(folder, v)) if is_descriptor(v) else v for v in values]
    return out
