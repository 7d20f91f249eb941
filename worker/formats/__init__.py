"""SOL-ExecBench's own JSON formats: definition.json, workload.jsonl, solution.json."""

from worker.formats.definition import Axis, Definition, TensorSpec
from worker.formats.exceptions import FormatError
from worker.formats.loaders import (
    load_definition,
    load_solution,
    load_workloads,
    solution_from_python_file,
)
from worker.formats.solution import Solution, SolutionSpec, SourceFile
from worker.formats.workload import Workload, WorkloadInput

__all__ = [
    "Axis",
    "Definition",
    "FormatError",
    "Solution",
    "SolutionSpec",
    "SourceFile",
    "TensorSpec",
    "Workload",
    "WorkloadInput",
    "load_definition",
    "load_solution",
    "load_workloads",
    "solution_from_python_file",
]
