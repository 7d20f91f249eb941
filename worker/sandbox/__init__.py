"""Runs a submission in a child process; only tensors cross back (docs/design.md, "Trust boundary")."""

from worker.sandbox.isolation import Isolation, IsolationPolicy, IsolationUnavailable
from worker.sandbox.runner import (
    Sandbox,
    SandboxCrash,
    SandboxError,
    SandboxTimeout,
    SubmissionError,
    default_isolation,
    namespaces_available,
)

__all__ = ["Isolation", "IsolationPolicy", "IsolationUnavailable", "default_isolation", "namespaces_available", "Sandbox", "SandboxCrash", "SandboxError", "SandboxTimeout", "SubmissionError"]
