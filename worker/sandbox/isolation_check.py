"""Proof, at a worker's start, that the sandbox really isolates: start an isolated child and look from inside.

`check_isolation()` starts a namespaces sandbox, runs a probe there and reports what it saw: the
uid (not root, not the worker's), network (no interface but loopback; a port this process listens
on cannot be reached), the worker's own process (not visible in /proc) and the filesystem (the
interpreter's prefix and the engine's package are read-only). The caller decides what to do with a
failed check; the service refuses to take untrusted work unless its operator opted out.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import torch
from pydantic import BaseModel

import worker
from worker.formats import Solution
from worker.sandbox.isolation import Isolation, IsolationPolicy, IsolationUnavailable
from worker.sandbox.protocol import CallRequest
from worker.sandbox.runner import Sandbox, SandboxError

_PROBE = """
import os, socket, torch

def _reachable(port):
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
        return 1
    except OSError:
        return 0

def _writable(folder):
    path = os.path.join(folder, f".probe-{os.getpid()}-{id(folder)}")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        return 0
    os.unlink(path)
    return 1

def _sees(pid, start):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19] == start)
    except OSError:
        return 0

def run(x):
    interfaces = [name for _, name in socket.if_nameindex()]
    return torch.tensor([os.getuid(), os.getgid(), _reachable(PORT), int(interfaces not in ([], ["lo"])),
                         _sees(PARENT_PID, PARENT_START), _writable(PREFIX), _writable(PACKAGE), _writable("/")])
"""


class IsolationReport(BaseModel):
    isolation: str
    uid: int | None = None
    gid: int | None = None
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _probe_solution(port: int) -> Solution:
    source = (
        _PROBE.replace("PORT", str(port))
        .replace("PARENT_PID", str(os.getpid()))
        .replace("PARENT_START", repr(_start_time(os.getpid())))
        .replace("PREFIX", repr(sys.prefix))
        .replace("PACKAGE", repr(str(Path(worker.__file__).parent)))
    )
    return Solution.model_validate(
        {
            "name": "isolation_probe",
            "definition": "isolation_probe",
            "spec": {"language": "python", "entry_point": "probe.py::run", "destination_passing_style": False},
            "sources": [{"path": "probe.py", "content": source}],
        }
    )


def check_isolation(
    policy: IsolationPolicy | None = None, timeout_s: float = 120.0, isolation: Isolation = "namespaces"
) -> IsolationReport:
    """Start a child under `isolation` and verify from inside it that the isolation holds."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        with Sandbox(
            "cpu", isolation=isolation, policy=policy, start_timeout_s=timeout_s, default_timeout_s=timeout_s
        ) as sb:
            sb.load(_probe_solution(listener.getsockname()[1]))
            seen = sb.send(CallRequest(args=[torch.zeros(1)])).outputs[0].tolist()
    except (IsolationUnavailable, SandboxError, OSError) as err:
        return IsolationReport(isolation=isolation, problems=[f"the isolated sandbox did not start: {err}"])
    finally:
        listener.close()
    uid, gid, reached, interfaces, sees_parent, w_prefix, w_package, w_root = (int(v) for v in seen)
    problems = []
    if uid in (0, os.getuid()) or gid == 0:
        problems.append(f"the child runs as uid {uid} / gid {gid} (root or the worker's own uid)")
    if reached:
        problems.append("the child reached a port this worker listens on at 127.0.0.1")
    if interfaces:
        problems.append("the child has network interfaces besides loopback")
    if sees_parent:
        problems.append("the child sees the worker's process in /proc")
    for flag, what in ((w_prefix, "the Python environment"), (w_package, "the engine's package"), (w_root, "/")):
        if flag:
            problems.append(f"the child can write to {what}")
    return IsolationReport(isolation=isolation, uid=uid, gid=gid, problems=problems)
