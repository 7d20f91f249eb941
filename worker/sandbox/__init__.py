"""Runs a submission in a child process; only tensors cross back (see DESIGN.md, trust boundary)."""

from worker.sandbox.runner import (
    Sandbox,
    SandboxCrash,
    SandboxError,
    SandboxTimeout,
    SubmissionError,
)

__all__ = ["Sandbox", "SandboxCrash", "SandboxError", "SandboxTimeout", "SubmissionError"]
