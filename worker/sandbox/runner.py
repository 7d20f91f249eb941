"""The trusted side: spawn the child, talk to it, kill its process group on timeout."""

from __future__ import annotations

import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import torch

from worker.formats import Solution
from worker.sandbox import device_share, framing, isolation, protocol, spill
from worker.sandbox.isolation import Isolation, IsolationPolicy, namespaces_available
from worker.sandbox.memory import ChildCgroup, cgroup_note
from worker.sandbox.output import OutputCapture
from worker.sandbox.protocol import ArtifactWire, HelloRequest, LoadReply, LoadRequest, Reply, Request, SourceWire
import contextlib

ReplyT = TypeVar("ReplyT", bound=Reply)

# The only variables a submission's process sees. Database and broker URLs,
# API keys and webhook secrets never reach it.
_ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_INTERPRET",
    "TRITON_PTXAS_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "OMP_NUM_THREADS",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "PYTORCH_CUDA_ALLOC_CONF",
)


class SandboxError(RuntimeError):
    """The child could not do what was asked; `kind` says why, `log` holds its stderr tail."""

    kind = "sandbox"

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class SandboxTimeout(SandboxError):
    kind = "timeout"


class SandboxCrash(SandboxError):
    kind = "crash"


class SandboxOutOfMemory(SandboxError):
    """The device ran out of memory in the child. On a GPU shared by several audits that is the auditor's load as
    often as the kernel's own appetite, so it is inconclusive, never a kernel failure (nor a pass)."""

    kind = "out_of_memory"


def reports_out_of_memory(error: str) -> bool:
    """Whether a child's error names the device running out of memory: the caching allocator's OutOfMemoryError, or
    the driver's own `CUDA error: out of memory` (a torch.AcceleratorError), which a new CUDA context or a launch
    raises when neighbours hold the card, as an import did at eight audits on an 80 GiB H100. A submission can
    raise either on purpose; that only earns it `error` (never ranked) after the engine's retries."""
    head = error.split(":", 1)[0].removeprefix("torch.")
    if head == "OutOfMemoryError":
        return True
    return head == "AcceleratorError" and "out of memory" in error.split("\n", 1)[0].lower()


class MalformedReply(SandboxCrash):
    """The child's reply does not validate against its op's reply model (worker.sandbox.protocol): a submission
    that forged or broke the harness's reply. Nothing of it is used, and the child is closed."""


class SubmissionError(SandboxError):
    """The submission raised (import error, exception in the kernel, wrong return)."""

    kind = "submission"


def scrubbed_env(home: Path, device: str = "cpu") -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}
    if not device.startswith("cuda"):
        # Triton kernels run on the CPU only under its interpreter
        env["TRITON_INTERPRET"] = "1"
    elif (cuda_lib := isolation.libcuda_dir()) is not None:
        env["TRITON_LIBCUDA_PATH"] = str(cuda_lib)  # Triton's own lookup runs ldconfig, which the sandbox cannot
    env.update(
        HOME=str(home),
        TMPDIR=str(home),
        TRITON_CACHE_DIR=str(home / ".triton"),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _child_setup(policy: IsolationPolicy | None, cgroup: ChildCgroup | None = None) -> Callable[[], None]:
    def setup() -> None:  # runs in the forked process before exec
        if cgroup is not None:
            cgroup.join()
        if sys.platform.startswith("linux"):
            # the child runs in its own session, so a parent killed outright (SIGKILL, OOM) could not
            # take it down: have the kernel kill it when the parent dies
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        # no RLIMIT_AS: CUDA reserves far more virtual memory than it uses
        isolation.limit_resources(policy)

    return setup


def default_isolation() -> Isolation:
    """Namespaces when this host allows them; otherwise "none", said loudly (a developer's own kernel only)."""
    if namespaces_available():
        return "namespaces"
    warnings.warn(
        "bubblewrap namespaces are not available on this host: the submission runs UNISOLATED, as this user, "
        "with the network open. Only audit your own kernels this way.",
        RuntimeWarning,
        stacklevel=2,
    )
    return "none"


class Sandbox:
    """One child process per audit; `request` sends an op and waits for its reply.

    `isolation` is "namespaces" (bubblewrap, see worker.sandbox.isolation) or "none"; left out, the
    default is namespaces when available (see `default_isolation`).
    """

    def __init__(
        self,
        device: str = "cpu",
        *,
        default_timeout_s: float = 300.0,
        start_timeout_s: float = 120.0,
        interrupts: tuple[type[BaseException], ...] = (),
        isolation: Isolation | None = None,
        policy: IsolationPolicy | None = None,
    ) -> None:
        self.device = device
        # raised into a request from outside (a Celery time limit): the child is killed and the exception goes on
        self.interrupts = interrupts
        self.default_timeout_s = default_timeout_s
        self.start_timeout_s = start_timeout_s
        self._isolation: Isolation = isolation if isolation is not None else default_isolation()
        self.policy = policy or IsolationPolicy()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ns: isolation.NamespaceInfo | None = None
        self._spill_fd = -1
        self._ns_pidfd = -1
        self._to_child = -1
        self._from_child = -1
        self._share: socket.socket | None = None  # device outputs' fds arrive here (worker.sandbox.device_share)
        self._exporter: device_share.Exporter | None = None  # and large inputs' fds leave from here
        self._share_inputs_failed = False
        self._loaded: Solution | None = None
        self._cgroup: ChildCgroup | None = None
        # a compiled solution's extension (worker.compile_step.LoadableArtifact), set before it is loaded
        self.artifact: Any = None

    @property
    def isolation(self) -> Isolation:
        """Which isolation the child runs under, for the audit report."""
        return self._isolation

    @property
    def pid_namespace(self) -> int | None:
        """Inode of the child's PID namespace (namespaces only), to check that nothing in it survives."""
        return self._ns.pid_namespace if self._ns else None

    # lifecycle -----------------------------------------------------------
    @property
    def memory_note(self) -> str:
        """How this child's memory is bounded (the report's evidence)."""
        if self._cgroup is None:
            return "RLIMIT_DATA only" if self._isolation == "namespaces" else "no memory limit (isolation 'none')"
        return f"{self.policy.max_data_bytes or 0} bytes: {cgroup_note(self._cgroup)}"

    def start(self) -> None:
        # a neutral name: with isolation "none" the child sees this folder as its HOME
        if self._isolation == "namespaces" and isolation.bwrap_binary() is None:
            raise SandboxError("isolation 'namespaces' was asked for, but bubblewrap (bwrap) is not installed")
        self._tmp = tempfile.TemporaryDirectory(dir=spill.host_root(self.device))
        host = Path(self._tmp.name)
        c_read, p_write = os.pipe()
        p_read, c_write = os.pipe()
        self._spill_dir = host / spill.FOLDER
        self._spill_dir.mkdir(mode=0o700)
        self._spill_fd = spill.open_folder(self._spill_dir)  # opened before the child exists: it cannot swap it
        command = [sys.executable, "-m", "worker.sandbox.child", str(c_read), str(c_write)]
        fds = [c_read, c_write]
        share_child: socket.socket | None = None
        if device_share.enabled(self.device):
            self._share, share_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            command.append(str(share_child.fileno()))
            fds.append(share_child.fileno())
        info_r = info_w = -1
        if self._isolation == "namespaces":
            bwrap = isolation.bwrap_binary() or "bwrap"
            uid = isolation.sandbox_uid(self.policy)
            if isolation.as_root():
                os.chown(self._spill_dir, uid, uid)
            info_r, info_w = os.pipe()
            fds.append(info_w)
            try:
                command = isolation.bwrap_argv(bwrap, uid, self.policy, self._spill_dir, info_w, self.device, command)
            except isolation.IsolationUnavailable as err:
                for fd in (info_r, info_w, c_read, c_write, p_read, p_write):
                    os.close(fd)
                self._close_share(share_child)
                raise SandboxError(str(err)) from err
            home = Path(isolation.WORK_DIR)
            extra_env = {
                "USER": "user",
                "LOGNAME": "user",
            }  # its uid has no passwd entry: getpass.getuser() needs these
        else:
            home = host
            extra_env = {}
        if self._isolation == "namespaces" and self.policy.max_data_bytes is not None:
            self._cgroup = ChildCgroup(self.policy.max_data_bytes)
        self._output = OutputCapture()
        stderr = self._output.write_fd
        try:
            self._proc = subprocess.Popen(
                command,
                cwd=host,
                env={**scrubbed_env(home, self.device), **extra_env},
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                pass_fds=fds,
                start_new_session=True,
                preexec_fn=_child_setup(self.policy if self._isolation == "namespaces" else None, self._cgroup),
            )
        finally:
            self._output.child_started()
            for fd in fds:
                if share_child is None or fd != share_child.fileno():
                    os.close(fd)
            if share_child is not None:
                share_child.close()
        self._to_child, self._from_child = p_write, p_read
        if info_r >= 0:
            try:
                self._ns = isolation.read_info(info_r, self.start_timeout_s)
                # bwrap (our child) has not reaped its init yet, so this pid is still that process
                self._ns_pidfd = os.pidfd_open(self._ns.child_pid)
            except (isolation.IsolationUnavailable, ValueError) as err:
                log = self.log_tail()
                self.close()
                raise SandboxError(f"the isolated sandbox could not be set up: {err}", log) from err
        hello = self.send(
            HelloRequest(device=self.device, device_share=self._share is not None), timeout_s=self.start_timeout_s
        )
        if not hello.device_share:
            self._close_share()  # the child could not export: its outputs come through the host

    def _close_share(self, other: socket.socket | None = None) -> None:
        for s in (self._share, other):
            if s is not None:
                s.close()
        self._share = None

    @property
    def shares_device_outputs(self) -> bool:
        """Whether large GPU outputs reach the parent as exported device memory, not host files."""
        return self._share is not None

    def close(self) -> None:
        if self._proc is not None:
            self._kill()
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_child = self._from_child = -1
        self._close_share()
        if self._exporter is not None:
            self._exporter.release()
            self._exporter = None
        self._ns = None
        if self._spill_fd >= 0:
            os.close(self._spill_fd)
            self._spill_fd = -1
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self._cgroup is not None:
            self._cgroup.close()
            self._cgroup = None
        self._loaded = None

    def _kill(self) -> None:
        assert self._proc is not None
        if self._ns_pidfd >= 0:
            # the namespace's init: when it dies the kernel kills every process in the namespace, whatever
            # session or process group they moved to, and init's exit completes only once they are all gone
            try:
                signal.pidfd_send_signal(self._ns_pidfd, signal.SIGKILL)
                select.select([self._ns_pidfd], [], [], 10)
            except ProcessLookupError:
                pass
            os.close(self._ns_pidfd)
            self._ns_pidfd = -1
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        self._proc = None

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, n: int = 4000) -> str:
        """The end of the child's output (capped; see worker.sandbox.output)."""
        output = getattr(self, "_output", None)
        return output.text(n) if output is not None else ""

    # protocol ------------------------------------------------------------
    def send(self, request: Request[ReplyT], *, timeout_s: float | None = None) -> ReplyT:
        """One op in the child: its reply, validated against the op's reply model. A reply that does not validate
        is MalformedReply; an error reply is SubmissionError, SandboxOutOfMemory or (the harness's) SandboxError."""
        if self._proc is None:
            raise SandboxCrash("sandbox is not running")
        op = request.op
        fields = self._round_trip(op, request.wire(), timeout_s)
        try:
            reply: ReplyT = protocol.parse(type(request).reply_type, fields, f"reply to '{op}'")
        except protocol.MalformedMessage as err:
            self._refuse(str(err))
        return reply

    def _refuse(self, why: str) -> NoReturn:
        """A reply that does not validate: the child lied or broke its harness, so it is closed, not reused."""
        log = self.log_tail()
        self.close()
        raise MalformedReply(f"the submission's process sent a {why}", log)

    def request(self, op: str, payload: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """`send` for scripts and tests that speak in dicts: the request made from `payload` (ValueError, before
        anything is sent, for an unknown op or fields it does not take), the validated reply as a frame's dict."""
        return {"ok": True, **self.send(protocol.request_for(op, payload), timeout_s=timeout_s).wire()}

    def _round_trip(self, op: str, payload: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        """The frame out (large inputs shared or spilled) and the reply's fields back, an error reply raised."""
        timeout = timeout_s if timeout_s is not None else self.default_timeout_s
        # every reply must echo this request's nonce: a frame the submission forged
        # (or a stream shifted by one) is caught here or at the next request
        nonce = secrets.token_hex(8)
        # large inputs go as exported device memory where the child takes it, the rest as files in the sandbox's
        # folder; the exports are released and the files removed once the reply is in
        exporter = self._input_exporter() if "args" in payload else None
        if exporter is not None:
            payload = self._share_inputs(exporter, payload, nonce)
        spill_fd = self._spill_fd
        try:
            payload, written = spill.spill_message(spill_fd, payload, nonce)
        except (spill.SpillError, OSError) as err:
            if exporter is not None:
                exporter.release()
            log = self.log_tail()
            self.close()
            raise SandboxCrash(f"the sandbox's spill folder was tampered with before '{op}': {err}", log) from err
        try:
            return self._exchange(op, nonce, payload, timeout)
        except self.interrupts:  # mid-request the stream is out of step: the child cannot be reused
            self.close()
            raise
        finally:
            if exporter is not None:
                exporter.release()
            if self._spill_fd == spill_fd >= 0:  # a sandbox closed meanwhile took its folder with it
                spill.remove(spill_fd, written)

    def _input_exporter(self) -> device_share.Exporter | None:
        """This sandbox's exporter of large inputs (worker.sandbox.device_share), where the child takes device
        memory and KAUDIT_DEVICE_SHARE_INPUTS is not 0; made at the first request with inputs."""
        if self._share is None or not device_share.inputs_enabled():
            return None
        if self._exporter is None:
            try:
                self._exporter = device_share.Exporter(torch.device(self.device))
            except Exception:  # noqa: BLE001 - the driver cannot export here: inputs go through the host instead
                self._share_inputs_failed = True
        return None if self._share_inputs_failed else self._exporter

    def _share_inputs(self, exporter: device_share.Exporter, payload: dict[str, Any], nonce: str) -> dict[str, Any]:
        """The payload with its large inputs exported, their fds sent ahead of the frame; unchanged (inputs through
        the host) where the child has not read the last request's fds or its end of the socket takes no more."""
        assert self._share is not None
        if device_share.unread_bytes(self._share):
            # the child left an earlier request's fds unread: exports it holds that way stay allocated, so no more
            return payload
        shared, fds = exporter.share_message(payload, device_share.INPUT_KEYS, from_host=True)
        try:
            device_share.send_fds(self._share, nonce, fds, block=False)
        except OSError:
            exporter.release()
            return payload
        return shared

    def _exchange(self, op: str, nonce: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            framing.write_frame(self._to_child, {"op": op, "nonce": nonce, **payload})
        except (BrokenPipeError, OSError) as err:
            log = self.log_tail()
            self.close()
            raise SandboxCrash(f"the submission's process died ({err})", log) from err
        deadline = time.monotonic() + timeout
        ready, _, _ = select.select([self._from_child], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            log = self.log_tail()
            self.close()
            raise SandboxTimeout(f"'{op}' did not finish within {timeout:.0f} s; the process group was killed", log)
        try:
            reply = self._read_with_deadline(deadline)
        except SandboxTimeout:
            log = self.log_tail()
            self.close()
            raise SandboxTimeout(
                f"the reply to '{op}' did not finish arriving within {timeout:.0f} s; the process group was killed", log
            ) from None
        except (EOFError, OSError, ValueError) as err:
            code = self._proc.poll() if self._proc else None
            log = self.log_tail()
            self.close()
            raise SandboxCrash(f"the submission's process died during '{op}' (exit code {code})", log) from err
        except Exception as err:  # a frame that is not safe tensors-and-data: treat as hostile
            if isinstance(err, self.interrupts):
                self.close()
                raise
            log = self.log_tail()
            self.close()
            raise SandboxCrash(f"the submission's process sent an unreadable reply to '{op}': {err}", log) from err
        if reply.get("nonce") != nonce:
            log = self.log_tail()
            self.close()
            raise SandboxCrash(
                f"the reply to '{op}' is out of sequence: the result channel was written by someone else", log
            )
        try:
            reply = device_share.receive_message(self._share, reply, nonce, self.device, deadline)
            reply = spill.unspill_message(self._spill_fd, reply, copy=True)
        except device_share.DeviceShareOutOfMemory as err:
            # the card is full (audits sharing it): inconclusive, as when the kernel's own process runs out. The
            # stream is in step and every fd was closed, so the child stays usable
            raise SandboxOutOfMemory(
                f"the device ran out of memory while taking the kernel's outputs ({err})", self.log_tail()
            ) from err
        except (spill.SpillError, OSError) as err:
            log = self.log_tail()
            self.close()
            raise SandboxCrash(f"the submission's process sent an unreadable reply to '{op}': {err}", log) from err
        reply.pop("nonce")
        ok = reply.pop("ok", None)
        if ok is True:
            return reply
        if ok is not False:
            self._refuse(f"malformed reply to '{op}': ok: neither true nor false")
        try:
            error: protocol.ErrorReply = protocol.parse(protocol.ErrorReply, reply, f"error reply to '{op}'")
        except protocol.MalformedMessage as err:
            self._refuse(str(err))
        if error.kind == "harness":
            raise SandboxError(error.error, self.log_tail())
        if reports_out_of_memory(error.error):
            raise SandboxOutOfMemory(
                f"the device ran out of memory in the submission's process ({error.error[:300]})", error.traceback
            )
        raise SubmissionError(error.error, error.traceback)

    def _read_with_deadline(self, deadline: float) -> dict[str, Any]:
        # a reply can arrive in pieces; each read waits only until the deadline
        def wait() -> None:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_child], [], [], max(0.0, left))
            if not ready:
                raise SandboxTimeout("reply did not arrive in time", self.log_tail())

        return framing.read_frame(self._from_child, wait)

    # ops -----------------------------------------------------------------
    def load(self, solution: Solution) -> LoadReply:
        artifact = None
        if solution.spec.is_cpp:
            # a compiled solution loads the extension its build produced (worker.compile_step), checked by its hash
            if self.artifact is None:
                raise SandboxError("a C++ solution needs its built extension before it can be loaded")
            artifact = ArtifactWire(
                sha256=self.artifact.sha256, entry_symbol=self.artifact.entry_symbol, data=self.artifact.data
            )
        reply = self.send(
            LoadRequest(
                sources=[SourceWire(path=s.path, content=s.content) for s in solution.sources],
                entry_file=solution.spec.entry_file,
                entry_function=solution.spec.entry_function,
                dps=solution.spec.destination_passing_style,
                artifact=artifact,
            )
        )
        self._loaded = solution
        return reply

    def ensure(self, solution: Solution) -> None:
        """Start (or restart after a crash) and load the solution."""
        if not self.alive:
            self.close()
            self.start()
        if self._loaded is not solution:
            self.load(solution)
