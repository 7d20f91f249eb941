"""Device outputs cross the trust boundary as exported CUDA memory (worker.sandbox.device_share).

The GPU tests run a real isolated sandbox: an honest kernel's large output arrives on the parent's device, equal to
what the kernel returned, without a spill file; each forgery of the fd channel (tests/worker/cheats/exploits/
device_share_forge.py) is refused, the parent's CUDA context stays usable and no received fd stays open. The CPU
tests check the parent's checks of the fd message and of descriptors on real sockets and fds.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch

from worker.formats import Solution
from worker.numerics import checks
from worker.sandbox import (
    Sandbox,
    SandboxCrash,
    SandboxTimeout,
    device_share,
    namespaces_available,
    spill,
)

EXPLOITS = Path(__file__).resolve().parents[1] / "cheats" / "exploits"


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def _solution(source: str) -> Solution:
    return Solution.model_validate(
        {
            "name": "device-share",
            "definition": "exploit",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": False},
            "sources": [{"path": "k.py", "content": source}],
        }
    )


def _sandbox() -> Sandbox:
    return Sandbox("cuda", isolation="namespaces" if namespaces_available() else "none", default_timeout_s=120)


HONEST = """
import torch

def run(x):
    n = 3 * (1 << 20) + 7  # not a multiple of the allocation granularity
    a = torch.arange(n, device="cuda", dtype=torch.float32) * x[0]
    return a, a[: 1 << 20].to(torch.bfloat16).reshape(1024, 1024), torch.tensor([5], device="cuda")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("share", ["1", "0"])
def test_an_honest_kernels_large_outputs_arrive_on_the_parents_device(
    share: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAUDIT_DEVICE_SHARE", share)
    files_read: list[str] = []  # the parent's reads of output files the child wrote to its spill folder
    read_copy = spill.read_copy
    monkeypatch.setattr(spill, "read_copy", lambda folder, d: files_read.append(d["__spill__"]) or read_copy(folder, d))
    with _sandbox() as sb:
        assert sb.shares_device_outputs == (share == "1")
        sb.load(_solution(HONEST))
        x = torch.tensor([0.5])
        for _ in range(3):  # the child releases the last reply's exports at the next request
            reply = sb.request("call", {"args": [x], "outputs": [], "poison": None})
            big, square, small = reply["outputs"]
            assert big.device.type == ("cuda" if share == "1" else "cpu")
            assert small.device.type == "cpu"  # under the 1 MiB threshold: in the frame, as before
            n = 3 * (1 << 20) + 7
            assert torch.equal(big.cpu(), torch.arange(n, dtype=torch.float32) * 0.5)
            assert square.dtype == torch.bfloat16 and square.shape == (1024, 1024)
            assert torch.equal(
                square.cpu().float().reshape(-1), (torch.arange(1 << 20, dtype=torch.float32) * 0.5).bfloat16().float()
            )
            assert int(small) == 5
    # on the device path no output crossed through a host file; on the host path the two large ones did, each call
    assert len(files_read) == (0 if share == "1" else 6), files_read


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["not_cuda", "oversize", "extra_fds", "no_fds"])
def test_a_forged_device_output_is_refused_and_the_parent_stays_healthy(mode: str) -> None:
    torch.ones(1, device="cuda").sum().item()  # the parent's own CUDA context exists before
    before = _open_fds()
    source = (EXPLOITS / "device_share_forge.py").read_text().replace("__MODE__", mode)
    with _sandbox() as sb:
        assert sb.shares_device_outputs
        sb.load(_solution(source))
        t0 = time.monotonic()
        with pytest.raises((SandboxCrash, SandboxTimeout)) as caught:
            sb.request(
                "call",
                {"args": [torch.zeros(1)], "outputs": [], "poison": None},
                timeout_s=20 if mode == "no_fds" else 120,
            )
        if mode != "no_fds":
            assert time.monotonic() - t0 < 60  # refused, not waited out
        assert "unreadable reply" in str(caught.value) or mode == "no_fds"
        assert not sb.alive
    assert _open_fds() <= before  # every fd the child sent was closed
    assert torch.ones(4, device="cuda").sum().item() == 4.0  # the parent's CUDA context still works


INPUTS = """
import torch

def run(x, y, z):
    assert x.device.type == "cuda" and y.device.type == "cuda"
    x.mul_(2)  # writes into its input: the parent's copy must not see it, the digest must
    return x, y.clone(), z + 1
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("share", ["1", "0"])
def test_large_inputs_reach_the_child_on_the_device(share: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large host inputs arrive on the child's device bit for bit; none crosses through a host file on the device
    path (two per call without it); a kernel's write into its input leaves the parent's copy alone and shows in the
    digest; no fd leaks."""
    monkeypatch.setenv("KAUDIT_DEVICE_SHARE_INPUTS", share)
    files_written: list[str] = []  # the parent's writes of request tensors into the child's spill folder
    write = spill.write
    monkeypatch.setattr(spill, "write", lambda folder, name, t: files_written.append(name) or write(folder, name, t))
    torch.ones(1, device="cuda").sum().item()
    before = _open_fds()
    n = 3 * (1 << 20) + 7  # not a multiple of the allocation granularity
    x = torch.arange(n, dtype=torch.float32)  # on the host
    y = torch.randn(1024, 1024).to(torch.bfloat16)
    z = torch.ones(3)  # under the 1 MiB threshold: in the frame
    with _sandbox() as sb:
        sb.load(_solution(INPUTS))
        for _ in range(3):
            reply = sb.request("call", {"args": [x, y, z], "outputs": [], "poison": None, "digest_after": True})
            doubled, y_back, z_back = reply["outputs"]
            assert torch.equal(doubled.cpu(), torch.arange(n, dtype=torch.float32) * 2)
            assert torch.equal(y_back.cpu().view(torch.int16), y.cpu().view(torch.int16))
            assert torch.equal(z_back.cpu(), z + 1)
            assert torch.equal(x, torch.arange(n, dtype=torch.float32))  # the parent's own copy, untouched
            mutated = checks.check_inputs_unmodified(
                ["x", "y", "z"], [("call", [x, y, z], reply["args_after"])], "cuda"
            )
            assert mutated.details["mutated"] == {"x": ["call"]}
    assert len(files_written) == (0 if share == "1" else 6), files_written
    assert _open_fds() <= before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_child_that_never_takes_its_device_inputs_gets_them_through_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/worker/cheats/exploits/device_share_hoard.py leaves the first request's fds unread in its socket: every
    later request's inputs go through host files, so no more of the parent's exports pile up."""
    files_written: list[str] = []
    write = spill.write
    monkeypatch.setattr(spill, "write", lambda folder, name, t: files_written.append(name) or write(folder, name, t))
    x = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    with _sandbox() as sb:
        sb.load(_solution((EXPLOITS / "device_share_hoard.py").read_text()))
        first = sb.request("call", {"args": [x], "outputs": [], "poison": None})
        assert first["outputs"][0].cpu().tolist() == [-1.0] * 4  # exported, sent, never taken
        assert device_share.unread_bytes(sb._share) > 0
        for _ in range(3):
            reply = sb.request("call", {"args": [x], "outputs": [], "poison": None})
            assert reply["outputs"][0].cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert len(files_written) == 3, files_written


# the parent's checks, on the CPU ---------------------------------------------------------------------------


def test_unread_bytes_tells_whether_the_peer_took_the_last_message() -> None:
    """What the parent checks before it exports a request's inputs (SIOCOUTQ on its end of the socket)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        assert device_share.unread_bytes(parent) == 0
        fd = os.open("/dev/null", os.O_RDONLY)
        device_share.send_fds(parent, "abcd", [fd], block=False)
        os.close(fd)
        assert device_share.unread_bytes(parent) > 0
        _, got, _, _ = socket.recv_fds(child, 64, 2)
        for g in got:
            os.close(g)
        assert device_share.unread_bytes(parent) == 0
    finally:
        parent.close()
        child.close()


def test_the_fd_message_must_carry_the_nonce_and_exactly_the_named_fds() -> None:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        before = _open_fds()
        deadline = time.monotonic() + 30
        for tag, n_sent, expected, err in [
            ("abcd", 2, 2, None),  # the honest case
            ("wrong", 1, 1, "another nonce"),
            ("abcd", 3, 1, "got"),  # more fds than descriptors: truncated, refused
            ("abcd", 1, 2, "got 1"),
        ]:
            sent = [os.open("/dev/null", os.O_RDONLY) for _ in range(n_sent)]
            socket.send_fds(child, [tag.encode()], sent)
            for fd in sent:
                os.close(fd)
            if err is None:
                got = device_share._receive_fds(parent, "abcd", expected, deadline)
                assert len(got) == expected
                for fd in got:
                    os.close(fd)
            else:
                with pytest.raises(device_share.DeviceShareError, match=err):
                    device_share._receive_fds(parent, "abcd", expected, deadline)
            assert _open_fds() == before  # nothing received stays open
        with pytest.raises(device_share.DeviceShareError, match="did not arrive"):
            device_share._receive_fds(parent, "abcd", 1, time.monotonic())  # nothing sent: the deadline ends it
    finally:
        parent.close()
        child.close()


@pytest.mark.parametrize(
    "desc",
    [
        {"__device__": 0, "dtype": "object", "shape": [4]},
        {"__device__": 0, "dtype": "float32", "shape": [-1]},
        {"__device__": 0, "dtype": "float32", "shape": [2.5]},
        {"__device__": 0, "dtype": "float32", "shape": "4"},
        {"__device__": 0, "dtype": "float32", "shape": [1 << 39, 1 << 39]},
        {"__device__": 0, "dtype": "float32", "shape": [0]},
    ],
)
def test_a_malformed_descriptor_is_refused_before_anything_is_mapped(desc: dict) -> None:
    with pytest.raises(device_share.DeviceShareError):
        device_share._shape(desc)


def test_device_outputs_without_a_share_channel_are_refused() -> None:
    reply = {"outputs": [{"__device__": 0, "dtype": "float32", "shape": [1 << 20]}]}
    with pytest.raises(device_share.DeviceShareError, match="shares none"):
        device_share.receive_message(None, reply, "abcd", "cuda", time.monotonic() + 1)
    assert (
        device_share.receive_message(None, {"outputs": [torch.zeros(2)]}, "abcd", "cpu", 0.0)["outputs"][0].numel() == 2
    )
