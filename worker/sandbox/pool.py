"""Sandbox children started ahead of the audits that will use them: a worker process's spare.

Starting a child costs seconds (bubblewrap, Python, `import torch`, the GPU's context), paid before the
first kernel call of every audit. A pool starts the next child while the current audit runs, so a warm
worker's audit finds one ready. Each child still serves exactly one audit: `take` hands it over and the
audit closes it (the audit's context owns it from then on); it is never returned. A child that died while
waiting is replaced, not handed out. Nothing a submission did can reach a later audit through the pool:
the spare was started before that submission was loaded anywhere, in namespaces of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from worker.sandbox.isolation import Isolation
from worker.sandbox.protocol import WarmRequest
from worker.sandbox.runner import Sandbox, SandboxError


class SandboxPool:
    """One spare child per (device, isolation); `take` returns a started one and asks for the next.

    Children are started by one long-lived thread of the pool's own: the kernel's parent-death signal
    (PR_SET_PDEATHSIG, set in every child) fires when the *thread* that forked the child exits, so a
    short-lived starter thread would take its children down with it. The pool's thread lives until `close`,
    which is for a worker process's end."""

    def __init__(
        self,
        device: str,
        isolation: Isolation | None = None,
        *,
        factory: Callable[[], Sandbox] | None = None,
        warm: bool | None = None,
    ) -> None:
        # warm-up (worker.canary.warm) by default on a GPU only: on a 2-core CPU it competes with the running audit
        self.device, self.isolation = device, isolation
        self.warm = warm if warm is not None else device.startswith("cuda")
        self._factory = factory or (lambda: Sandbox(device, isolation=isolation))
        self._cond = threading.Condition()
        self._spare: Sandbox | None = None
        self._wanted = False  # a spare was asked for and is not ready yet
        self._pending: list[Callable[[], None]] = []  # jobs for the starter thread
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="sandbox-starter", daemon=True)
        self._thread.start()
        self.handed_warm = 0  # audits that found a child ready
        self.last_warm_s: float | None = None  # the last spare's warm-up, as its child timed it

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._pending.pop(0)
            job()

    def _run_in_starter(self, fn: Callable[[], Sandbox]) -> Sandbox:
        """fn() on the starter thread (so the child outlives this caller's thread); its result or its error."""
        done = threading.Event()
        box: dict[str, object] = {}

        def job() -> None:
            try:
                box["value"] = fn()
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box["error"] = err
            done.set()

        with self._cond:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            self._pending.append(job)
            self._cond.notify_all()
        done.wait()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]

    def _started(self) -> Sandbox:
        sb = self._factory()
        try:
            sb.start()
        except BaseException:
            sb.close()
            raise
        return sb

    def _start_spare(self) -> None:
        sb: Sandbox | None = None
        try:
            sb = self._started()
            if sb is not None and self.warm:
                # first use of the device's kernels, off the audit's clock (worker.canary.warm)
                self.last_warm_s = sb.send(WarmRequest(steps=2), timeout_s=sb.start_timeout_s).seconds
        except Exception:  # noqa: BLE001 - any error: a spare that never became ready would hang every `take`
            if sb is not None:
                sb.close()
            sb = None  # the audit that takes next starts its own, and reports the error there
        with self._cond:
            if self._closed and sb is not None:
                sb.close()
                sb = None
            self._spare, self._wanted = sb, False
            self._cond.notify_all()

    def prestart(self) -> None:
        """Start a spare in the background unless one is ready or on its way."""
        with self._cond:
            if self._closed or self._spare is not None or self._wanted:
                return
            self._wanted = True
            self._pending.append(self._start_spare)
            self._cond.notify_all()

    def wait_ready(self) -> None:
        """Block until the spare on its way (if any) has started (or failed to)."""
        with self._cond:
            while self._wanted and not self._closed:
                self._cond.wait()

    def take(self) -> Sandbox:
        """A started child for one audit (the spare if it is alive, else one started now); the next spare starts."""
        self.wait_ready()  # a spare half-started is still sooner than a new one
        with self._cond:
            sb, self._spare = self._spare, None
        if sb is not None and not sb.alive:
            sb.close()
            sb = None
        if sb is None:
            sb = self._run_in_starter(self._started)
        else:
            self.handed_warm += 1
        self.prestart()
        return sb

    def close(self) -> None:
        """Close the spare and stop the starter thread (children it started for audits die with it: a worker's end)."""
        with self._cond:
            self._closed = True
            sb, self._spare = self._spare, None
            self._cond.notify_all()
        self._thread.join()
        if sb is not None:
            sb.close()
