"""Shared by the catalogue tests: the CPU-capable examples and one sandbox child per example."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.expectations import runs_on
from worker.catalogue import Problem, load_catalogue
from worker.formats import Solution
from worker.inputs import Case
from worker.sandbox import Sandbox


def cpu_solutions(problem: Problem) -> dict[str, Solution]:
    return {n: s for n, s in sorted(problem.example_solutions().items()) if runs_on(s.spec, "cpu")}


def solution_ids(problems: list[str]) -> list[tuple[str, str]]:
    cat = load_catalogue()
    return [(p, n) for p in problems for n in cpu_solutions(cat.get(p))]


class SandboxPool:
    """One sandbox child per example solution, started on first use and kept for the module."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._boxes: dict[tuple[str, str], Sandbox] = {}

    def get(self, problem: Problem, name: str) -> Sandbox:
        key = (problem.name, name)
        if key not in self._boxes:
            box = Sandbox(self.device, default_timeout_s=240)
            box.start()  # on the CPU the sandbox runs Triton under its interpreter
            box.load(problem.example_solution(name))
            self._boxes[key] = box
        return self._boxes[key]

    def close(self) -> None:
        for box in self._boxes.values():
            box.close()


def call(box: Sandbox, problem: Problem, case: Case, *, noncontiguous: list[int] | None = None) -> list[torch.Tensor]:
    """Run the kernel on `case` with NaN-poisoned outputs; `noncontiguous`: input positions passed as strided views."""
    defn = problem.definition
    payload: dict[str, Any] = {"args": case.args(defn), "outputs": case.output_specs(defn), "poison": float("nan")}
    if noncontiguous:
        payload["noncontiguous"] = noncontiguous
    # GPU outputs arrive on the device (worker.sandbox.device_share); the tests compare on the host, with the oracle
    return [o.cpu() if isinstance(o, torch.Tensor) else o for o in box.request("call", payload)["outputs"]]
