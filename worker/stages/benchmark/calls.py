"""Every request the stage sends to the submission's sandbox goes through `request`, so that no reply is trusted
from a process that did not survive sending it, and a sandbox error becomes the stage's Failure."""

from __future__ import annotations

from typing import TypeVar

from worker.context import AuditContext
from worker.sandbox import Sandbox, SandboxError, SandboxOutOfMemory
from worker.sandbox.protocol import HelloRequest, Reply, Request
from worker.stages.benchmark.failure import Failure
from worker.stages.result import StageStatus

ReplyT = TypeVar("ReplyT", bound=Reply)


def request(sb: Sandbox, ctx: AuditContext, req: Request[ReplyT], where: str, *, liveness: bool = True) -> ReplyT:
    """One op in the sandbox, then proof the process is still the one that answered.

    A submission can write a forged reply frame to the child's pipe and exit; the
    frame reads fine, but the process is gone. A round trip after every reply
    turns that into a crash the stage reports instead of trusting the reply.
    """
    try:
        reply: ReplyT = sb.send(req)
    except (
        SandboxOutOfMemory
    ):  # the device's load, not the kernel: the engine waits for memory and runs the stage again
        raise
    except SandboxError as err:
        status = StageStatus.error if err.kind == "sandbox" else StageStatus.failed
        official = "TIMEOUT" if err.kind == "timeout" else "RUNTIME_ERROR"
        raise Failure(
            f"{where}: the kernel failed ({err.kind}): {err}", status, official=official, log=err.log[-2000:]
        ) from err
    if not liveness:  # the caller checks later, outside the window it times
        return reply
    try:
        sb.send(HelloRequest(device=ctx.device), timeout_s=60)
    except SandboxError as err:
        raise Failure(
            f"{where}: the submission's process did not survive its own reply to '{req.op}' ({err.kind}); "
            "a reply followed by an exit is how a forged result channel looks, so the reply is not trusted",
            log=err.log[-2000:],
        ) from err
    return reply
