"""Large tensors cross the trust boundary as files in the sandbox's own folder, not through the pipe.

A 1 GB logits tensor through the pipe is copied six times (save, frame, write, read, join,
load); as a file it is written once and read once, and the child maps its inputs without a
copy. Only the top-level lists `args` (parent to child), `outputs` and `args_after` (child to
parent) are spilled; every other value still travels in the frame. A spilled tensor is
replaced by a small descriptor: {"__spill__": file name, "dtype": name, "shape": [...]}.

The files give the submission no power it lacks: what it could write into one it could
return as an output. The parent treats everything in the folder as hostile: every file is opened
relative to a directory descriptor the parent opened itself (the child cannot swap the folder), with
O_NOFOLLOW (a planted symbolic link is refused, for reading and for writing), O_NONBLOCK (a planted
FIFO cannot hang the parent) and, for writes, O_EXCL (a planted file of the same name is refused);
only regular files are read, the name must be a plain name, the dtype one of a fixed set, the size
exact and under MAX_BYTES, and the bytes are copied out at once (the child could change the file later).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
from collections.abc import Callable
from typing import Any

import torch

SPILL_BYTES = 1 << 20  # tensors at least this large go through files
MAX_BYTES = 64 * 1024**3  # no descriptor may claim more than this
FOLDER = "spill"  # inside the sandbox's home, the one folder the child may write
SPILLED_KEYS = ("args", "outputs", "args_after")
_NAME = re.compile(r"^[a-z]+-[0-9a-f]{1,32}-[0-9]{1,6}\.bin$")
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


SHM = "/dev/shm"
SHM_MIN_FREE = 16 * 1024**3  # memory-backed spill folders only on a host with this much room there


def host_root(device: str) -> str | None:
    """Where a sandbox's host folder (and so its spill files) lives: KAUDIT_SPILL_DIR when set; for a GPU sandbox,
    /dev/shm when it has room (a file there is a memory copy, not a disk write: a 1 GiB output crosses in a fraction
    of the time); else None, the system's temporary folder."""
    explicit = os.environ.get("KAUDIT_SPILL_DIR")
    if explicit:
        return explicit
    if not device.startswith("cuda"):
        return None
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return SHM if st.f_bavail * st.f_frsize >= SHM_MIN_FREE else None


class SpillError(ValueError):
    """A descriptor or spill file that does not describe what it claims."""


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _bytes_of(t: torch.Tensor) -> memoryview:
    flat = t.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def open_folder(path: str | os.PathLike[str]) -> int:
    """A descriptor of the spill folder itself (never a link), for every later open relative to it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def write(folder: int, name: str, t: torch.Tensor) -> dict[str, Any]:
    """Write a CPU tensor's bytes to a new file `name` in the folder and return its descriptor."""
    dtype = _dtype_name(t)
    if dtype not in _DTYPES:
        raise SpillError(f"cannot spill a {t.dtype} tensor")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        owner = os.fstat(folder)
        if owner.st_uid != os.geteuid():
            # a root parent writing for an unprivileged child: the file is the folder owner's (the child maps it)
            os.fchown(fd, owner.st_uid, owner.st_gid)
        data = _bytes_of(t)
        while data:
            n = os.write(fd, data)
            data = data[n:]
    finally:
        os.close(fd)
    return {"__spill__": name, "dtype": dtype, "shape": list(t.shape)}


def is_descriptor(value: object) -> bool:
    return isinstance(value, dict) and "__spill__" in value


def _checked(d: dict[str, Any]) -> tuple[str, torch.dtype, list[int], int]:
    name = d.get("__spill__")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpillError(f"bad spill file name {name!r}")
    return (name, *checked_layout(d))


def checked_layout(d: dict[str, Any]) -> tuple[torch.dtype, list[int], int]:
    """A descriptor's dtype (one of a fixed set), shape (non-negative ints) and byte count (under MAX_BYTES), as
    the receiving side computes it: never taken from the sender."""
    dtype_name, shape = d.get("dtype"), d.get("shape")
    if not isinstance(dtype_name, str) or dtype_name not in _DTYPES:
        raise SpillError(f"bad spill dtype {dtype_name!r}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise SpillError(f"bad spill shape {shape!r}")
    dtype = _DTYPES[dtype_name]
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise SpillError(f"spill descriptor claims {nbytes} bytes, over the limit of {MAX_BYTES}")
    return dtype, shape, nbytes


def _open_regular(folder: int, name: str, flags: int) -> int:
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SpillError(f"spill file {name} is not a regular file")
    return fd


def read_copy(folder: int, d: dict[str, Any]) -> torch.Tensor:
    """Parent side: a private copy of a tensor the child spilled, checked against its descriptor."""
    name, dtype, shape, nbytes = _checked(d)
    try:
        fd = _open_regular(folder, name, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise SpillError(f"spill file {name} holds {size} bytes, its descriptor says {nbytes}")
            out = torch.empty(shape, dtype=dtype)
            if nbytes:
                view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
                got = 0
                while got < nbytes:
                    n = os.readv(fd, [view[got:]])
                    if n <= 0:
                        raise SpillError(f"spill file {name} ended early")
                    got += n
        finally:
            os.close(fd)
    finally:
        remove(folder, [name])
    return out


def map_input(folder: int, d: dict[str, Any]) -> torch.Tensor:
    """Child side: the parent's input, mapped from its file without a copy (writes reach the file)."""
    name, dtype, shape, nbytes = _checked(d)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    fd = _open_regular(folder, name, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != nbytes:
            raise SpillError(f"spill file {name} does not hold {nbytes} bytes")
        mapped = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return torch.frombuffer(mapped, dtype=dtype, count=nbytes // dtype.itemsize).view(shape)


def remove(folder: int, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=folder)  # a link planted under this name is removed, not followed


def map_listed(message: dict[str, Any], keys: tuple[str, ...], fn: Callable[[str, int, Any], Any]) -> dict[str, Any]:
    """A copy of `message` in which every item of the lists under `keys` is replaced by fn(key, index, item)."""
    out = dict(message)
    for key in keys:
        values = message.get(key)
        if isinstance(values, list):
            out[key] = [fn(key, i, v) for i, v in enumerate(values)]
    return out


def spill_message(folder: int, message: dict[str, Any], tag: str) -> tuple[dict[str, Any], list[str]]:
    """Replace the large tensors of the spilled keys by descriptors; returns the names of the files written."""
    written: list[str] = []

    def spill(key: str, i: int, v: Any) -> Any:
        if (
            isinstance(v, torch.Tensor)
            and v.device.type == "cpu"
            and v.nbytes >= SPILL_BYTES
            and _dtype_name(v) in _DTYPES
        ):
            name = f"{key.replace('_', '')}-{tag}-{i}.bin"
            descriptor = write(folder, name, v)
            written.append(name)
            return descriptor
        return v

    return map_listed(message, SPILLED_KEYS, spill), written


def unspill_message(folder: int, message: dict[str, Any], *, copy: bool) -> dict[str, Any]:
    """Replace descriptors by tensors: private copies (parent) or mappings (child)."""

    def unspill(_key: str, _i: int, v: Any) -> Any:
        if not is_descriptor(v):
            return v
        return read_copy(folder, v) if copy else map_input(folder, v)

    return map_listed(message, SPILLED_KEYS, unspill)
