"""Runs a submission in a child process; only tensors cross back (docs/design.md, "Trust boundary").

The runner (and torch with it) is imported on first use, so `worker.sandbox.isolation` can be used by
processes that never run a kernel (the API, `kaudit serve`'s set-up)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from worker.sandbox.isolation import (
    Isolation,
    IsolationPolicy,
    IsolationUnavailable,
    namespaces_available,
)

_FROM_RUNNER = (
    "MalformedReply",
    "Sandbox",
    "SandboxCrash",
    "SandboxError",
    "SandboxOutOfMemory",
    "SandboxTimeout",
    "SubmissionError",
    "default_isolation",
)


def __getattr__(name: str) -> Any:
    if name in _FROM_RUNNER:
        return getattr(import_module("worker.sandbox.runner"), name)
    raise AttributeError(f"module 'worker.sandbox' has no attribute '{name}'")


__all__ = [
    "Isolation",
    "IsolationPolicy",
    "IsolationUnavailable",
    "namespaces_available",
    *_FROM_RUNNER,
]
