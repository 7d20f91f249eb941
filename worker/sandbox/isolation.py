"""OS isolation of the sandbox child through bubblewrap (Debian package `bubblewrap`).

What the child gets (policy "namespaces"):
- its own PID namespace (it sees only its own processes; killing the namespace's init, which the
  Sandbox does on close or timeout, makes the kernel kill every process in it, `setsid` daemons included),
  network namespace with no interface but loopback, IPC, UTS and (where possible) cgroup namespaces;
- an unprivileged uid/gid without capabilities and with no_new_privs: as root, bwrap builds the
  namespaces and `setpriv` drops to a fresh uid of its own on the host (`fresh_uid`: no file on the host
  is its, and RLIMIT_NPROC counts only this sandbox's processes); as a non-root worker (the Docker
  image), bwrap maps the worker's uid to 65534 inside a new user namespace (the process limit then
  counts per namespace) and nested user namespaces are disabled;
- a mount namespace that shows only what Python and torch need, read-only (/usr, the interpreter's
  prefix, the environment's site-packages, the engine's own `worker` package, a few /etc files, CUDA
  devices and /sys on GPU workers), a private size-capped tmpfs at /tmp holding its HOME, TMPDIR and
  Triton cache (gone when the namespace dies), and one read-write folder, the spill folder;
- resource limits (set before exec, inherited): processes, open files, file size, CPU seconds, data
  segment (memory, sized from the host per concurrent child: worker.sandbox.memory), no core dumps;
  and, where the worker's own memory cgroup is writable, a memory cgroup of the child's own with the same limit
  (it counts shared mappings and page cache, which RLIMIT_DATA does not).
Policy "none" runs the child as the worker's user with only the scrubbed environment, its own session
and no core dumps: for a developer's own kernel, never for untrusted code.
Not done here: a seccomp filter (as root the child may still create user namespaces of its own, inside
which the mounts stay locked read-only); a limit on GPU memory (no cgroup counts it); RLIMIT_CPU is per process.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.sandbox.memory import child_limit_bytes

Isolation = Literal["namespaces", "none"]

# inside the sandbox: neutral names, nothing that says "audit"
WORK_DIR = "/tmp/work"
_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "os-release",
)
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

GiB = 1024**3


class IsolationPolicy(BaseModel):
    """Limits and identity for one sandbox child."""

    model_config = ConfigDict(frozen=True)

    uid: int | None = Field(
        None,
        ge=1,
        description="None: as root, a fresh uid per sandbox (its process limit is then its own, not "
        "shared with other audits); as a non-root worker, 65534 inside the user namespace",
    )

    max_processes: int = Field(256, ge=8, description="RLIMIT_NPROC: threads count too (torch starts one per core)")
    max_open_files: int = Field(1024, ge=64)
    max_file_bytes: int = Field(2 * GiB, ge=1)
    max_cpu_seconds: int = Field(4 * 3600, ge=1)
    max_data_bytes: int | None = Field(
        default_factory=child_limit_bytes,
        description="RLIMIT_DATA (heap and private writable mappings), and the child's memory cgroup limit where "
        "one can be made (worker.sandbox.memory); by default a share of this host's memory per concurrent child; "
        "None: unlimited",
    )
    tmp_bytes: int = Field(4 * GiB, ge=1 << 20, description="size of the private /tmp (HOME, Triton cache)")


FRESH_UIDS = (1 << 20, 1 << 30)  # as root: each sandbox draws its uid (and gid) from this range, unused on hosts


def fresh_uid() -> int:
    return FRESH_UIDS[0] + secrets.randbelow(FRESH_UIDS[1] - FRESH_UIDS[0])


def sandbox_uid(policy: IsolationPolicy) -> int:
    """The uid the child runs as (inside its namespaces): the policy's, else fresh (root) or 65534."""
    if policy.uid is not None:
        return policy.uid
    return fresh_uid() if as_root() else 65534


class IsolationUnavailable(RuntimeError):
    """bubblewrap is missing or the host does not allow the namespaces it needs."""


def bwrap_binary() -> str | None:
    return shutil.which("bwrap")


def _ro_roots(device: str) -> list[Path]:
    """Host paths the child needs to read, bound at the same place."""
    import worker

    paths = [
        Path("/usr"),
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.executable).resolve().parent.parent,
        Path(worker.__file__).resolve().parent,
    ]
    for entry in sys.path:
        # site-packages folders outside the prefixes (a user site, PYTHONPATH entries are not bound:
        # only the engine's own package and the environment's packages)
        p = Path(entry)
        if p.name in ("site-packages", "dist-packages") and p.is_dir():
            paths.append(p.resolve())
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            paths.append(Path(os.environ[var]))
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry:
            paths.append(Path(entry))
    if device.startswith("cuda"):
        paths.append(Path("/sys"))
        cuda_lib = libcuda_dir()
        if cuda_lib is not None:
            paths.append(cuda_lib.resolve())
    return _outermost([p for p in paths if p.exists() and p != Path("/")])


def _outermost(paths: list[Path]) -> list[Path]:
    """Drop paths inside another listed path; keep order stable."""
    out: list[Path] = []
    for p in sorted(set(paths), key=lambda q: len(q.parts)):
        if not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def libcuda_dir() -> Path | None:
    """Where the driver's libcuda.so.1 is, found by the trusted parent: Triton looks for it with `ldconfig -p`,
    which cannot run inside the sandbox, so the child is told (TRITON_LIBCUDA_PATH) and the folder is bound."""
    try:
        listing = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        listing = ""
    found = [line.split()[-1] for line in listing.splitlines() if "libcuda.so.1" in line]
    dirs = [Path(f).parent for f in found] + [Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    return next((d for d in dirs if (d / "libcuda.so.1").exists()), None)


def _gpu_devices() -> list[str]:
    dev = Path("/dev")
    return sorted(str(p) for p in dev.glob("nvidia*")) + ([str(dev / "dri")] if (dev / "dri").exists() else [])


def as_root() -> bool:
    return os.geteuid() == 0


def bwrap_argv(
    bwrap: str,
    uid: int,
    policy: IsolationPolicy,
    spill_host: Path,
    info_fd: int,
    device: str,
    command: list[str],
    extra_ro: Sequence[Path] = (),
) -> list[str]:
    """The full argv: bwrap's options, then (as root) setpriv dropping to `uid` (gid the same), then `command`.

    `extra_ro`: more host folders bound read-only at the same place (a build's toolchain: worker.build)."""
    argv = [
        bwrap,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "localhost",
        "--die-with-parent",
        "--new-session",
        "--info-fd",
        str(info_fd),
    ]
    if as_root():
        # bwrap builds the namespaces with real root; setpriv then becomes the unprivileged uid
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(uid), "--gid", str(uid), "--cap-drop", "ALL"]
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
    # the private /tmp first: read-only roots that live under /tmp (a checkout or a venv there) are bound on top
    # of it below, rather than hidden by it. As root the tmpfs is root's: the child's uid needs to write its HOME
    # there (nobody else is inside)
    argv += [
        "--perms",
        "1777",
        "--size",
        str(policy.tmp_bytes),
        "--tmpfs",
        "/tmp",
        "--perms",
        "0777" if as_root() else "0700",
        "--dir",
        WORK_DIR,
        "--bind",
        str(spill_host),
        f"{WORK_DIR}/{spill_host.name}",
    ]
    extra = [p for p in extra_ro if p.exists() and p != Path("/")]
    for root in _outermost([*_ro_roots(device), *extra]) if extra else _ro_roots(device):
        argv += [*_mkdirs(root.parent), "--ro-bind", str(root), str(root)]
    # as root bwrap would make /etc 0700 for these binds: the child's uid could then read none of them, nor follow
    # a symlink through /etc/alternatives (/usr/local/cuda -> /etc/alternatives/cuda on CUDA images)
    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in _ETC:
        host = Path("/etc") / name
        if host.exists():
            argv += ["--ro-bind", str(host), str(host)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if device.startswith("cuda"):
        for node in _gpu_devices():
            argv += ["--dev-bind", node, node]
    argv += ["--chdir", WORK_DIR]
    if as_root():
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise IsolationUnavailable("setpriv (util-linux) is missing: cannot drop to an unprivileged uid")
        argv += [
            "--",
            setpriv,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--",
        ]
    else:
        argv += ["--"]
    return argv + command


def _mkdirs(parent: Path) -> list[str]:
    """bwrap creates missing parents 0700 as root: make them traversable first."""
    out: list[str] = []
    for p in reversed([parent, *parent.parents]):
        if p != Path("/"):
            out += ["--perms", "0755", "--dir", str(p)]
    return out


def limit_resources(policy: IsolationPolicy | None) -> None:
    """Runs in the forked child before exec (bwrap or python); the limits are inherited."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if policy is None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * GiB, 2 * GiB))
        return
    for res, value in (
        (resource.RLIMIT_NPROC, policy.max_processes),
        (resource.RLIMIT_NOFILE, policy.max_open_files),
        (resource.RLIMIT_FSIZE, policy.max_file_bytes),
        (resource.RLIMIT_CPU, policy.max_cpu_seconds),
        (resource.RLIMIT_DATA, policy.max_data_bytes),
    ):
        if value is not None:
            resource.setrlimit(res, (value, value))


class NamespaceInfo(BaseModel):
    """What bwrap reports on --info-fd: the host pid of the namespace's init and the namespaces' inodes."""

    child_pid: int = Field(alias="child-pid")
    pid_namespace: int | None = Field(None, alias="pid-namespace")
    net_namespace: int | None = Field(None, alias="net-namespace")


def read_info(fd: int, timeout_s: float) -> NamespaceInfo:
    """Waits until bwrap has written its info (it does before running the command), then closes fd."""
    with os.fdopen(fd, "rb") as f:
        ready, _, _ = select.select([f], [], [], timeout_s)
        if not ready:
            raise IsolationUnavailable(f"bubblewrap did not set up the sandbox within {timeout_s:.0f} s")
        data = f.read()
    if not data:
        raise IsolationUnavailable("bubblewrap exited before setting up the sandbox")
    return NamespaceInfo.model_validate(json.loads(data))


def processes_in_pid_namespace(ns_inode: int) -> list[int]:
    """Host pids of live processes whose PID namespace has this inode."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}/ns/pid").st_ino != ns_inode:
                continue
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(d))
    return found


def namespaces_available() -> bool:
    """bubblewrap is installed and can build the sandbox's namespaces here (a trivial run, a few ms)."""
    bwrap = bwrap_binary()
    if bwrap is None:
        return False
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    if not as_root():
        argv[1:1] = ["--unshare-user"]
    try:
        return subprocess.run([*argv, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
