"""The isolation itself: the start-up check, the policy the sandbox reports, and the child's timing op."""

from __future__ import annotations

import os

import pytest
import torch

from worker.formats import Solution
from worker.sandbox import IsolationPolicy, Sandbox, default_isolation, namespaces_available
from worker.sandbox.isolation import WORK_DIR, processes_in_pid_namespace
from worker.sandbox.isolation_check import check_isolation

needs_namespaces = pytest.mark.skipif(not namespaces_available(), reason="bubblewrap namespaces are not available here")


def _solution(body: str, dps: bool = True) -> Solution:
    return Solution.model_validate(
        {
            "name": "iso",
            "definition": "x",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": dps},
            "sources": [{"path": "k.py", "content": body}],
        }
    )


@needs_namespaces
def test_the_start_up_check_passes_isolated_and_names_every_hole_unisolated() -> None:
    report = check_isolation()
    assert report.ok, report.problems
    assert report.uid not in (None, 0, os.getuid())
    bare = check_isolation(isolation="none")  # the same probe without the namespaces: the check must see the holes
    assert not bare.ok
    joined = " ".join(bare.problems)
    for hole in ("uid", "127.0.0.1", "sees the worker's process", "write to the Python environment", "write to /"):
        assert hole in joined


def test_the_start_up_check_fails_when_the_sandbox_cannot_start() -> None:
    # a policy the host refuses: no file may be written, so the child cannot even write its solution
    report = check_isolation(IsolationPolicy(max_file_bytes=1, max_open_files=64, max_processes=8), timeout_s=60)
    assert not report.ok


@needs_namespaces
def test_the_sandbox_says_which_isolation_it_used() -> None:
    assert default_isolation() == "namespaces"
    with Sandbox("cpu") as sb:
        assert sb.isolation == "namespaces" and sb.pid_namespace is not None
        ns = sb.pid_namespace
        sb.load(
            _solution(
                "import os, torch\ndef run(x):\n    return torch.tensor([os.getcwd() == '" + WORK_DIR + "'])\n",
                dps=False,
            )
        )
        assert sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None})["outputs"][0].tolist() == [
            1
        ]
    assert processes_in_pid_namespace(ns) == []
    with Sandbox("cpu", isolation="none") as sb:
        assert sb.isolation == "none" and sb.pid_namespace is None


@needs_namespaces
def test_the_time_op_gives_each_timed_call_fresh_inputs_and_a_fresh_poisoned_output() -> None:
    # the kernel records what it saw: the first input element and whether its output arrived poisoned
    body = (
        "import torch\ndef run(x, out):\n    out[0] = x[0]\n    out[1] = float(torch.isnan(out[2]))\n    out[2] = 0.0\n"
    )
    cases = [torch.full((4,), float(i)) for i in range(5)]
    with Sandbox("cpu") as sb:
        sb.load(_solution(body))
        reply = sb.request(
            "time",
            {
                "args": cases,
                "n_args": 1,
                "outputs": [{"shape": [3], "dtype": "float32"}],
                "poison": float("nan"),
                "warmup": 1,
                "reps": 5,
                "check": [1, 3],
            },
        )
    assert reply["clock"] == "wall_clock_cpu" and len(reply["times_ms"]) == 5 and reply["tampered"] == []
    assert reply["checked"] == [1, 3]
    assert [o.tolist() for o in reply["outputs"]] == [[1.0, 1.0, 0.0], [3.0, 1.0, 0.0]]
