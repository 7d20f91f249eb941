"""A sandbox child's memory limit comes from the host and the number of concurrent audits, and a memory cgroup
enforces it where the host lets the worker make one (worker.sandbox.memory)."""

from __future__ import annotations

import pytest

from worker.formats import Solution
from worker.sandbox import IsolationPolicy, Sandbox, SubmissionError, SandboxCrash, namespaces_available
from worker.sandbox import memory

GiB = 1024**3


def test_the_limit_is_a_share_of_the_host_per_concurrent_child(monkeypatch: pytest.MonkeyPatch) -> None:
    usable = memory.usable_bytes()
    one = memory.child_limit_bytes(1)
    assert one == max(memory.MIN_BYTES, int(usable * memory.SHARE / memory.CHILDREN_PER_AUDIT))
    assert one < usable, "one child may never take the whole host"
    assert memory.child_limit_bytes(8) <= one
    monkeypatch.setenv("KAUDIT_CONCURRENT_AUDITS", "4")
    assert IsolationPolicy().max_data_bytes == memory.child_limit_bytes(4)
    monkeypatch.setenv("KAUDIT_CONCURRENT_AUDITS", "not a number")
    assert memory.concurrent_audits() == 1


HOG = """import torch
HELD = []


def run(x):
    # touch the pages: shared-memory tensors are not counted by RLIMIT_DATA, only by a cgroup
    for _ in range(64):
        t = torch.empty(256 * 1024 * 1024 // 4).share_memory_()
        t.fill_(1.0)
        HELD.append(t)
    return x
"""


@pytest.mark.skipif(not namespaces_available(), reason="bubblewrap namespaces are not available here")
@pytest.mark.skipif(memory._own_memory_cgroup() is None, reason="no writable memory cgroup on this host")
def test_a_cgroup_stops_a_kernel_that_hoards_shared_memory() -> None:
    """Shared mappings escape RLIMIT_DATA; the child's own memory cgroup (limit 1 GiB here) stops them."""
    solution = Solution.model_validate(
        {
            "name": "hog",
            "definition": "x",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": False},
            "sources": [{"path": "k.py", "content": HOG}],
        }
    )
    sb = Sandbox("cpu", isolation="namespaces", policy=IsolationPolicy(max_data_bytes=1 * GiB), default_timeout_s=120)
    try:
        sb.start()
        assert "memory cgroup" in sb.memory_note
        cgroup = sb._cgroup.path  # the test checks where the child was placed
        assert cgroup is not None and cgroup.is_dir()
        sb.load(solution)
        import torch

        with pytest.raises((SandboxCrash, SubmissionError)):
            sb.request("call", {"args": [torch.ones(4)], "outputs": [], "poison": None})
    finally:
        sb.close()
    assert not cgroup.exists(), "the child's cgroup is removed with it"
