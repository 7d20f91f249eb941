"""Finding processes a test started: sandbox children, told apart by the folder they run in."""

from __future__ import annotations

import os
from pathlib import Path


def sandbox_children_under(folder: Path) -> list[int]:
    """Live sandbox child processes whose folder is under `folder` (sandboxes are made under TMPDIR).

    Unisolated, the child runs in that folder; isolated, it runs in its own mount namespace, and its
    parent (bubblewrap's init in the child's PID namespace) names the folder's spill path in its arguments."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{d}/cwd")
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            parent_cmd = Path(f"/proc/{stat[1]}/cmdline").read_bytes()
        except OSError:
            continue
        mine = cwd.startswith(str(folder)) or str(folder).encode() in parent_cmd
        if b"worker.sandbox.child" in cmd and mine and stat[0] not in ("Z", "X"):
            found.append(int(d))
    return found
