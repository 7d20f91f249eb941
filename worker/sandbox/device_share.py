"""GPU outputs cross the trust boundary on the device: CUDA virtual memory exported as file descriptors.

On a GPU worker the kernel's outputs used to travel device -> host -> file -> host -> device, both sides copying;
a 1 GiB `grad_logits` did that 30 times in one benchmark stage. Legacy CUDA IPC handles (what PyTorch's tensor
sharing uses) do not cross the sandbox's PID namespace, so this uses the driver's virtual memory management
instead: the child copies each large output into physical memory it made with `cuMemCreate`, exports it as a POSIX
file descriptor (`cuMemExportToShareableHandle`) and passes the descriptors over a Unix socket (SCM_RIGHTS) next to
its reply. The reply carries, in place of each such tensor, a descriptor {"__device__": k, "dtype", "shape"}.
The parent imports descriptor k, maps it, copies the bytes into a tensor of its own on its device at once, and
unmaps and releases it: nothing of the child's stays mapped in the parent.

The parent treats everything the child sends as hostile. The fds arrive in one message that must carry the
request's nonce and exactly as many fds as the reply has descriptors; dtype and shape pass the spill
descriptors' checks (worker.sandbox.spill.checked_layout: a fixed set of dtypes, non-negative sizes, under MAX_BYTES);
the parent computes the byte count itself and maps only that much (a handle whose memory is smaller is refused by the driver); an fd that is not a
CUDA allocation (a file, a pipe, /dev/null) is refused by the driver's import. Any of these ends the child. What the
child could still do, write into its memory while the parent copies, changes only the values it is judged on,
which it chooses anyway. Every received fd is closed, in every path.

Large inputs go the other way the same way: the parent copies each into memory of its own making, exports it and
sends the fds ahead of the request's frame; the child maps each, copies it into a tensor of its own and closes
them (`receive_message` with INPUT_KEYS). The parent keeps its exports until the reply is in, then releases them.
What the child could do with them: read inputs it is sent anyway, or write into memory the parent never reads
again. One thing it could do is hold them: fds it never reads keep the parent's exports allocated. So the parent
exports a request's inputs only when the child has read the last request's fds (`unread_bytes`: SIOCOUTQ on the
parent's end); otherwise, and where the send would block, the inputs go through host files
(tests/worker/cheats/exploits/device_share_hoard.py). `KAUDIT_DEVICE_SHARE_INPUTS=0` keeps inputs on the host.

Only the CPU-side Python and ctypes are used, no new dependency: `libcuda.so.1` is the driver every CUDA build of
torch already loads.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import os
import select
import socket
import termios
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from worker.sandbox.spill import (
    _DTYPES,
    SPILL_BYTES,
    SpillError,
    _dtype_name,
    checked_layout,
    map_listed,
)

KEY = "__device__"
SHARED_KEYS = ("outputs",)  # the child's replies: outputs (inputs after a call go back as digests where they are large)
INPUT_KEYS = ("args",)  # the parent's requests: inputs it made on the host or on its device (worker.sandbox.runner)
MAX_FDS = 64  # more device tensors than this in one message go through the host

_HANDLE_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_ALLOC_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_ACCESS_READWRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_MINIMUM = 0


class DeviceShareError(SpillError):
    """The driver refused an export or import, or a descriptor or fd message is not what it claims."""


class DeviceShareOutOfMemory(DeviceShareError):
    """The driver ran out of device memory while mapping or making an export: the card's load, not a forgery."""


_CUDA_ERROR_OUT_OF_MEMORY = 2


class _Location(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocProp(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [("location", _Location), ("flags", ctypes.c_int)]


def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(name))
        error = DeviceShareOutOfMemory if result == _CUDA_ERROR_OUT_OF_MEMORY else DeviceShareError
        raise error(f"{what} failed: {(name.value or b'CUDA error').decode()} ({result})")


def _prop(ordinal: int) -> _AllocProp:
    prop = _AllocProp()
    prop.type = _ALLOC_PINNED
    prop.requestedHandleTypes = _HANDLE_POSIX_FD
    prop.location = _Location(_LOCATION_DEVICE, ordinal)
    return prop


def _granularity(lib: ctypes.CDLL, ordinal: int) -> int:
    g = ctypes.c_size_t()
    _check(
        lib,
        lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(_prop(ordinal)), _GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity",
    )
    return int(g.value)


@dataclass(frozen=True)
class _Device:
    """The driver, one device's ordinal and its allocation granularity, with torch's primary context made current
    on this thread (the driver's calls act on the current context)."""

    device: torch.device
    lib: ctypes.CDLL
    ordinal: int
    granularity: int

    @classmethod
    def of(cls, device: torch.device) -> _Device:
        ordinal = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_device(ordinal)
        torch.cuda.synchronize(ordinal)
        lib = _driver()
        return cls(device, lib, ordinal, _granularity(lib, ordinal))

    def padded(self, nbytes: int) -> int:
        return -(-nbytes // self.granularity) * self.granularity


class _RawBytes:
    """A device address range in the CUDA array interface, for torch.as_tensor to wrap without a copy."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


@dataclass
class _Mapping:
    """One mapped allocation: reserve + map + access; `close` undoes it in reverse."""

    lib: ctypes.CDLL
    handle: ctypes.c_ulonglong
    ptr: ctypes.c_ulonglong = field(default_factory=ctypes.c_ulonglong)
    size: int = 0
    mapped: bool = False

    def map(self, size: int, dev: _Device) -> None:
        lib = self.lib
        _check(
            lib,
            lib.cuMemAddressReserve(
                ctypes.byref(self.ptr),
                ctypes.c_size_t(size),
                ctypes.c_size_t(dev.granularity),
                ctypes.c_ulonglong(0),
                ctypes.c_ulonglong(0),
            ),
            "cuMemAddressReserve",
        )
        self.size = size
        _check(
            lib,
            lib.cuMemMap(self.ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), self.handle, ctypes.c_ulonglong(0)),
            "cuMemMap",
        )
        self.mapped = True
        desc = _AccessDesc(_Location(_LOCATION_DEVICE, dev.ordinal), _ACCESS_READWRITE)
        _check(
            lib,
            lib.cuMemSetAccess(self.ptr, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1)),
            "cuMemSetAccess",
        )

    def bytes_view(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """The mapped bytes as a uint8 tensor (no copy; valid until `close`)."""
        return torch.as_tensor(_RawBytes(int(self.ptr.value or 0), nbytes), device=device)

    def close(self) -> None:
        lib = self.lib
        if self.mapped:
            lib.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
            self.mapped = False
        if self.size:
            lib.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
            self.size = 0
        if self.handle.value:
            lib.cuMemRelease(self.handle)
            self.handle = ctypes.c_ulonglong(0)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


# the child's side ------------------------------------------------------------------------------------------


class Exporter:
    """In the sandbox child: exports large device tensors and keeps each export alive until the next reply."""

    def __init__(self, device: torch.device) -> None:
        self.dev = _Device.of(device)
        self._live: list[tuple[_Mapping, int]] = []

    def release(self) -> None:
        """Drop the previous reply's exports (the parent copied them before it sent another request)."""
        for m, fd in self._live:
            m.close()
            os.close(fd)
        self._live = []

    def export(self, t: torch.Tensor) -> int:
        dev = self.dev
        nbytes = t.numel() * t.element_size()
        size = dev.padded(nbytes)
        lib = dev.lib
        handle = ctypes.c_ulonglong()
        _check(
            lib,
            lib.cuMemCreate(
                ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(_prop(dev.ordinal)), ctypes.c_ulonglong(0)
            ),
            "cuMemCreate",
        )
        m = _Mapping(lib, handle)
        try:
            m.map(size, dev)
            m.bytes_view(nbytes, dev.device).copy_(_flat_bytes(t))
            torch.cuda.synchronize(dev.ordinal)
            fd = ctypes.c_int(-1)
            _check(
                lib,
                lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, _HANDLE_POSIX_FD, ctypes.c_ulonglong(0)),
                "cuMemExportToShareableHandle",
            )
        except BaseException:
            m.close()
            raise
        self._live.append((m, fd.value))
        return fd.value

    def share_message(
        self, message: dict[str, Any], keys: tuple[str, ...] = SHARED_KEYS, from_host: bool = False
    ) -> tuple[dict[str, Any], list[int]]:
        """Replace the large device tensors of `keys` (with `from_host`, host tensors too: copied to the device
        once, into the export) by descriptors; returns the fds to send, in order. The rest go to the host."""
        fds: list[int] = []

        def share(_key: str, _i: int, v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            if (
                (from_host or v.device.type == "cuda")
                and v.nbytes >= SPILL_BYTES
                and _dtype_name(v) in _DTYPES
                and len(fds) < MAX_FDS
            ):
                try:
                    fds.append(self.export(v))
                except DeviceShareError:  # out of device memory, say: this one goes through the host
                    return v.cpu()
                return {KEY: len(fds) - 1, "dtype": _dtype_name(v), "shape": list(v.shape)}
            return v.cpu()

        return map_listed(message, keys, share), fds


def unread_bytes(sock: socket.socket) -> int:
    """What this end sent that the peer has not read yet (SIOCOUTQ): non-zero while a message, and any fds it
    carries, waits in the peer's queue."""
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf, True)
    return int(buf[0])


def send_fds(sock: socket.socket, tag: str, fds: list[int], block: bool = True) -> None:
    """One message: the request's nonce, with the fds attached (SCM_RIGHTS). `block=False` (the parent, whose
    peer may never read): a full socket raises BlockingIOError instead of waiting."""
    if fds:
        socket.send_fds(sock, [tag.encode()], fds, 0 if block else socket.MSG_DONTWAIT)


# the parent's side -----------------------------------------------------------------------------------------


def descriptors(message: dict[str, Any], keys: tuple[str, ...] = SHARED_KEYS) -> int:
    return sum(
        1
        for key in keys
        if isinstance(message.get(key), list)
        for v in message[key]
        if isinstance(v, dict) and KEY in v
    )


def _receive_fds(sock: socket.socket, tag: str, count: int, deadline: float) -> list[int]:
    left = max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([sock], [], [], left)
    if not ready:
        raise DeviceShareError("the device outputs' descriptors did not arrive in time")
    data, fds, flags, _ = socket.recv_fds(sock, 64, count + 1, socket.MSG_DONTWAIT)
    if data != tag.encode() or len(fds) != count or flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
        for fd in fds:
            os.close(fd)
        raise DeviceShareError(
            f"expected {count} device outputs with this request's nonce, got {len(fds)} "
            f"with {'the' if data == tag.encode() else 'another'} nonce"
        )
    return fds


def _shape(desc: dict[str, Any]) -> tuple[torch.dtype, list[int], int]:
    """The spill descriptors' checks, and no empty output (nothing to map: an honest child exports none)."""
    try:
        dtype, shape, nbytes = checked_layout(desc)
    except SpillError as err:
        raise DeviceShareError(f"a device output descriptor is malformed: {err}") from err
    if nbytes == 0:
        raise DeviceShareError("a device output descriptor claims 0 bytes")
    return dtype, shape, nbytes


def import_copy(fd: int, dtype: torch.dtype, shape: list[int], nbytes: int, dev: _Device) -> torch.Tensor:
    """Map the child's allocation behind `fd` and copy `nbytes` of it into a new tensor of the parent's own."""
    lib = dev.lib
    handle = ctypes.c_ulonglong()
    _check(
        lib,
        lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _HANDLE_POSIX_FD),
        "cuMemImportFromShareableHandle",
    )
    m = _Mapping(lib, handle)
    try:
        m.map(dev.padded(nbytes), dev)
        try:
            out = torch.empty(shape, dtype=dtype, device=dev.device)
        except torch.OutOfMemoryError:  # a card shared by several audits: the parent's copy goes to the host
            out = torch.empty(shape, dtype=dtype)
        _flat_bytes(out).copy_(m.bytes_view(nbytes, dev.device))
        torch.cuda.synchronize(dev.ordinal)
    finally:
        m.close()
    return out


def receive_message(
    sock: socket.socket | None,
    message: dict[str, Any],
    tag: str,
    device: str,
    deadline: float,
    keys: tuple[str, ...] = SHARED_KEYS,
) -> dict[str, Any]:
    """Replace the message's device descriptors by copies of this process's own; closes every fd it received.
    The parent takes a reply's outputs this way; the child, a request's inputs (`keys` INPUT_KEYS)."""
    count = descriptors(message, keys)
    if not count:
        return message
    if sock is None:
        raise DeviceShareError("the reply holds device outputs, but this sandbox shares none")
    fds = _receive_fds(sock, tag, count, deadline)
    try:
        dev = _Device.of(torch.device(device))

        def take(_key: str, _i: int, v: Any) -> Any:
            if not (isinstance(v, dict) and KEY in v):
                return v
            k = v[KEY]
            if type(k) is not int or not 0 <= k < count:
                raise DeviceShareError(f"a device output descriptor names fd {k!r} of {count}")
            return import_copy(fds[k], *_shape(v), dev)

        return map_listed(message, keys, take)
    finally:
        for fd in fds:
            os.close(fd)


def available(device: str) -> bool:
    """Whether this process can map device memory shared as POSIX fds on `device` (a CUDA build, a driver with
    VMM). Initialises CUDA in this process."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    try:
        _Device.of(torch.device(device))
    except Exception:  # noqa: BLE001 - any failure here means: outputs go through the host instead
        return False
    return True


def enabled(device: str) -> bool:
    """Device outputs are shared on a GPU that supports it, unless KAUDIT_DEVICE_SHARE=0 (outputs through host
    files: for comparisons)."""
    return os.environ.get("KAUDIT_DEVICE_SHARE", "1") != "0" and available(device)


def inputs_enabled() -> bool:
    """Large inputs go to the child as exported device memory too (where outputs do), unless
    KAUDIT_DEVICE_SHARE_INPUTS=0 (inputs through host files: for comparisons)."""
    return os.environ.get("KAUDIT_DEVICE_SHARE_INPUTS", "1") != "0"
