"""How much memory one sandbox child may take, and a cgroup that enforces it where the host lets us make one.

RLIMIT_DATA alone let a kernel reach 15.2 GiB of a 24 GiB host under a fixed 16 GiB limit: the limit must come
from the host. A child gets `SHARE` of the memory this worker may use (the host's, or its own cgroup's limit
where lower), divided among the audits that run at once (`KAUDIT_CONCURRENT_AUDITS`, set by the worker from its
concurrency; each audit may hold a kernel child and an uploaded reference's child, so two children an audit).

RLIMIT_DATA does not count shared mappings or page cache; a memory cgroup does. Where this process's own cgroup
(v2, or v1's memory controller) is writable, each child runs in a cgroup of its own under it with that limit;
elsewhere the RLIMIT is the only bound, and `cgroup_note()` says so for the report.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

GiB = 1024**3
SHARE = 0.6
CHILDREN_PER_AUDIT = 2
MIN_BYTES = 4 * GiB  # a GPU child's CUDA context and torch take a few GiB of host memory
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_limit_bytes() -> int | None:
    """This process's own memory cgroup limit, if it has one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines() if Path("/proc/self/cgroup").exists() else []:
        hid, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if hid == "0" and controllers == "":
            f = _CGROUP_ROOT / rel / "memory.max"
        elif "memory" in controllers.split(","):
            f = _CGROUP_ROOT / "memory" / rel / "memory.limit_in_bytes"
        else:
            continue
        try:
            raw = f.read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:
            return int(raw)
    return None


def usable_bytes() -> int:
    """Memory this worker may use: the host's, or its cgroup's limit where that is lower."""
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit_bytes()
    return min(host, limit) if limit else host


def concurrent_audits() -> int:
    try:
        return max(1, int(os.environ.get("KAUDIT_CONCURRENT_AUDITS", "1")))
    except ValueError:
        return 1


def child_limit_bytes(audits: int | None = None) -> int:
    """One sandbox child's memory limit: SHARE of what this worker may use, split among every child that can run."""
    n = (audits or concurrent_audits()) * CHILDREN_PER_AUDIT
    return max(MIN_BYTES, int(usable_bytes() * SHARE / n))


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(directory, limit file name) of this process's memory cgroup, if it can hold children we may write."""
    if not Path("/proc/self/cgroup").exists():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if hid == "0" and controllers == "":
            d, limit = _CGROUP_ROOT / rel, "memory.max"
            # v2: a child cgroup can limit memory only where this one delegates the controller
            try:
                if "memory" not in (d / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        elif "memory" in controllers.split(","):
            d, limit = _CGROUP_ROOT / "memory" / rel, "memory.limit_in_bytes"
        else:
            continue
        if d.is_dir() and os.access(d, os.W_OK):
            return d, limit
    return None


class ChildCgroup:
    """A memory cgroup for one sandbox child: made by the parent, joined by the child before exec, removed on close."""

    def __init__(self, limit_bytes: int) -> None:
        self.path: Path | None = None
        found = _own_memory_cgroup()
        if found is None:
            return
        parent, limit_file = found
        path = parent / f"kaudit-{secrets.token_hex(6)}"
        try:
            path.mkdir()
            (path / limit_file).write_text(str(limit_bytes))
        except OSError:
            self._remove(path)
            return
        self.path = path

    def join(self) -> None:
        """In the forked child before exec: move this process (and so everything it starts) into the cgroup."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        if self.path is not None:
            self._remove(self.path)
            self.path = None

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.rmdir()  # only once empty: the child's processes are gone by then


def cgroup_note(cgroup: ChildCgroup) -> str:
    if cgroup.path is not None:
        return "memory cgroup (counts shared mappings and page cache)"
    return "RLIMIT_DATA only (no writable memory cgroup on this host)"
