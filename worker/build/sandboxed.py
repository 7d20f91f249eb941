"""Runs a build's ninja file in the sandbox: the compiler and linker never run as the worker.

Sources are hostile, and a compiler is a large program that reads them. The build runs under the isolation the
kernels run under (worker.sandbox.isolation: bubblewrap namespaces, no network, an unprivileged uid, read-only
toolchain) with an environment that holds nothing but paths, and a compile budget:
- wall time: past it the whole PID namespace is killed (a compile that never ends: constexpr or template loops);
- CPU seconds and memory, per process (RLIMIT_CPU, RLIMIT_DATA): cc1plus, cicc and ptxas each;
- output: objects and the compilers' temporaries go to the sandbox's private, size-capped /tmp; the one folder
  it may write on the host gets only the artifact (and depfiles), each file capped (RLIMIT_FSIZE);
- processes (RLIMIT_NPROC).
The parent writes the sources and the ninja file; nothing of Python runs inside.

Layout of a build folder (host path H, seen as R by the compiler: /tmp/work/<name> when isolated, H otherwise):
  R/src/      the solution's files (the compiler's working folder)
  R/build.ninja
  R/deps/     one depfile per object (read back by the parent: worker.build.includes.check_dependencies)
  R/out/      the artifact
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from worker.build.result import BudgetKind, budget_from_log
from worker.sandbox import isolation
from worker.sandbox.isolation import Isolation, IsolationPolicy
from worker.sandbox.output import OutputCapture
import contextlib

GiB = 1024**3
OBJECTS_IN_SANDBOX = PurePosixPath("/tmp/obj")  # on the sandbox's private tmpfs: counted against output_bytes
CPU_GRACE_S = 10  # hard CPU limit past the soft one: SIGXCPU first, so the driver says "CPU time limit exceeded"


def _default_memory() -> int:
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(2 * GiB, min(12 * GiB, int(host * 0.5)))


class CompileBudget(BaseModel):
    """What one build may spend. The defaults fit a CUTLASS kernel (several GiB and minutes per translation unit)."""

    model_config = ConfigDict(frozen=True)

    wall_s: float = Field(900.0, gt=0, description="the whole build, set-up included")
    cpu_s: int = Field(1200, ge=1, description="CPU seconds of each compiler process")
    memory_bytes: int = Field(
        default_factory=_default_memory, ge=256 * 1024**2, description="RLIMIT_DATA of each compiler process"
    )
    output_bytes: int = Field(
        4 * GiB, ge=16 * 1024**2, description="objects and temporaries together (the private /tmp), and any one file"
    )
    max_processes: int = Field(256, ge=16)
    jobs: int = Field(
        default_factory=lambda: max(1, min(8, os.cpu_count() or 1)), ge=1, description="ninja -j: compiles at once"
    )


class BuildLayout(BaseModel):
    """A build folder: on the host, and as the compiler sees it."""

    model_config = ConfigDict(frozen=True)

    host: Path
    root: PurePosixPath
    objects: PurePosixPath

    @classmethod
    def for_folder(cls, host: Path, isolated: bool) -> "BuildLayout":
        if isolated:
            return cls(host=host, root=PurePosixPath(isolation.WORK_DIR) / host.name, objects=OBJECTS_IN_SANDBOX)
        return cls(host=host, root=PurePosixPath(host), objects=PurePosixPath(host) / "obj")

    @property
    def src(self) -> PurePosixPath:
        return self.root / "src"

    def to_host(self, path: PurePosixPath) -> Path:
        """A path under `root` as the parent sees it."""
        return self.host / path.relative_to(self.root)


class SandboxRun(BaseModel):
    """How the compiler's run ended."""

    returncode: int | None = Field(description="ninja's exit status; None when killed at the wall-time budget")
    seconds: float
    log: str
    budget_exceeded: BudgetKind | None = None
    isolation: Isolation


class BuildUnavailable(RuntimeError):
    """This worker cannot run an isolated build (bubblewrap missing or refused): the worker's fault, not the
    submission's."""


def compiler_env(layout: BuildLayout, path_dirs: Sequence[Path], isolated: bool) -> dict[str, str]:
    """All the compiler's environment: search paths and a neutral home. No variable of the worker's own (database
    and broker URLs, API keys, webhook secrets) is copied: the build gets none of it, by construction."""
    home = PurePosixPath(isolation.WORK_DIR) if isolated else layout.root
    dirs = list(dict.fromkeys([*map(str, path_dirs), "/usr/local/bin", "/usr/bin", "/bin"]))
    return {
        "PATH": ":".join(dirs),
        "HOME": str(home),
        "TMPDIR": "/tmp" if isolated else str(layout.root / "tmp"),
        "LC_ALL": "C",
        "LANG": "C",
        "USER": "user",
        "LOGNAME": "user",
    }


def _limits(policy: IsolationPolicy, isolated: bool, budget: CompileBudget) -> Callable[[], None]:
    def setup() -> None:  # in the forked child, before exec
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone if the worker dies
        if isolated:
            isolation.limit_resources(policy)  # the sandbox's own limits (policy.max_cpu_seconds has the grace)
        else:
            # only the limits that bound this build alone (RLIMIT_NPROC would count the developer's every process)
            for res, value in (
                (resource.RLIMIT_CORE, 0),
                (resource.RLIMIT_CPU, budget.cpu_s + CPU_GRACE_S),
                (resource.RLIMIT_DATA, budget.memory_bytes),
                (resource.RLIMIT_FSIZE, budget.output_bytes),
            ):
                resource.setrlimit(res, (value, value))
        # lowering the soft limit needs no privilege: SIGXCPU at the budget, SIGKILL at the hard limit after it
        resource.setrlimit(resource.RLIMIT_CPU, (budget.cpu_s, budget.cpu_s + CPU_GRACE_S))

    return setup


def run_ninja(
    layout: BuildLayout,
    ninja: Path,
    path_dirs: Sequence[Path],
    budget: CompileBudget,
    isolation_mode: Isolation,
    ro_roots: Sequence[Path] = (),
) -> SandboxRun:
    """Run R/build.ninja to its end or to the budget; the folder's out/ and deps/ hold what it made."""
    isolated = isolation_mode == "namespaces"
    command = [str(ninja), "-f", str(layout.root / "build.ninja"), "-C", str(layout.src), "-j", str(budget.jobs)]
    policy = IsolationPolicy(
        max_processes=budget.max_processes,
        max_file_bytes=budget.output_bytes,
        max_cpu_seconds=budget.cpu_s + CPU_GRACE_S,
        max_data_bytes=budget.memory_bytes,
        tmp_bytes=budget.output_bytes,
    )
    info_r = info_w = -1
    pass_fds: tuple[int, ...] = ()
    if isolated:
        bwrap = isolation.bwrap_binary()
        if bwrap is None:
            raise BuildUnavailable("bubblewrap (bwrap) is not installed: an untrusted build cannot be isolated")
        uid = isolation.sandbox_uid(policy)
        # the sandbox's uid reads the folder and writes only out/ and deps/ (as root: its own uid owns them; as a
        # non-root worker the uid maps to the worker's, which owns everything already)
        os.chmod(layout.host, 0o755)
        if isolation.as_root():
            for sub in ("out", "deps"):
                os.chown(layout.host / sub, uid, uid)
        info_r, info_w = os.pipe()
        pass_fds = (info_w,)
        try:
            command = isolation.bwrap_argv(bwrap, uid, policy, layout.host, info_w, "cpu", command, extra_ro=ro_roots)
        except isolation.IsolationUnavailable as err:
            os.close(info_r)
            os.close(info_w)
            raise BuildUnavailable(str(err)) from err
    output = OutputCapture()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,
            cwd=layout.host,
            env=compiler_env(layout, path_dirs, isolated),
            stdin=subprocess.DEVNULL,
            stdout=output.write_fd,
            stderr=output.write_fd,
            pass_fds=pass_fds,
            start_new_session=True,
            preexec_fn=_limits(policy, isolated, budget),
        )
    finally:
        output.child_started()
        if info_w >= 0:
            os.close(info_w)
    ns_pidfd = -1
    try:
        if info_r >= 0:
            try:
                info = isolation.read_info(info_r, min(budget.wall_s, 60.0))
                ns_pidfd = os.pidfd_open(info.child_pid)
            except (isolation.IsolationUnavailable, ValueError, OSError) as err:
                _kill(proc, ns_pidfd)
                output.close()
                raise BuildUnavailable(f"the build sandbox could not be set up: {err}\n{output.text(2000)}") from err
        try:
            returncode: int | None = proc.wait(timeout=max(0.0, budget.wall_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            returncode = None
    finally:
        _kill(proc, ns_pidfd)
    seconds = time.monotonic() - t0
    output.close()
    log = output.text(80_000)
    exceeded: BudgetKind | None = (
        "wall_time" if returncode is None else (budget_from_log(log) if returncode != 0 else None)
    )
    return SandboxRun(
        returncode=returncode, seconds=seconds, log=log, budget_exceeded=exceeded, isolation=isolation_mode
    )


def _kill(proc: subprocess.Popen[bytes], ns_pidfd: int) -> None:
    """Everything the build started: the PID namespace whole (its init's death takes every process in it, daemons
    included), else the process group."""
    if ns_pidfd >= 0:
        try:
            signal.pidfd_send_signal(ns_pidfd, signal.SIGKILL)
            select.select([ns_pidfd], [], [], 10)
        except ProcessLookupError:
            pass
        os.close(ns_pidfd)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def prepare_folder(host: Path) -> None:
    """The build folder's sub-folders (sources are written by the caller into src/)."""
    for sub in ("src", "out", "deps", "obj", "tmp"):
        (host / sub).mkdir(parents=True, exist_ok=True)


def remove_folder(host: Path) -> None:
    shutil.rmtree(host, ignore_errors=True)
