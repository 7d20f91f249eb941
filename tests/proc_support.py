"""Finding processes a test started: sandbox children, told apart by the folder they run in."""

from __future__ import annotations

import os
from pathlib import Path


def sandbox_children_under(folder: Path) -> list[int]:
    """Live sandbox child processes whose folder is under `folder` (sandboxes are made under TMPDIR)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{d}/cwd")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"worker.sandbox.child" in cmd and cwd.startswith(str(folder)) and state not in ("Z", "X"):
            found.append(int(d))
    return found
