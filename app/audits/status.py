"""The one vocabulary of audit statuses: queued and running, then the engine's outcomes."""

from __future__ import annotations

from enum import StrEnum


class AuditStatus(StrEnum):
    queued = "queued"
    running = "running"
    passed = "passed"
    failed = "failed"
    error = "error"
    timed_out = "timed_out"


FINISHED: frozenset[AuditStatus] = frozenset(
    {AuditStatus.passed, AuditStatus.failed, AuditStatus.error, AuditStatus.timed_out}
)
