"""SOL-ExecBench's own JSON formats: definition.json, workload.jsonl, solution.json."""

from worker.formats.definition import Axis, Definition, TensorSpec
from worker.formats.exceptions import FormatError
from worker.formats.loaders import (
    load_definition,
    load_solution,
    load_workloads,
    solution_from_python_file,
)
from worker.formats.hardware import DeviceKind, device_kinds
from worker.formats.languages import (
    CPP_LANGUAGES,
    GPU_ONLY_LANGUAGES,
    LANGUAGES,
    PYTHON_LANGUAGES,
    Language,
)
from worker.formats.solution import CompileOptions, Solution, SolutionSpec, SourceFile
from worker.formats.workload import Workload, WorkloadInput

__all__ = [
    "CPP_LANGUAGES",
    "GPU_ONLY_LANGUAGES",
    "LANGUAGES",
    "PYTHON_LANGUAGES",
    "Axis",
    "CompileOptions",
    "Definition",
    "DeviceKind",
    "FormatError",
    "Language",
    "Solution",
    "SolutionSpec",
    "SourceFile",
    "TensorSpec",
    "Workload",
    "WorkloadInput",
    "device_kinds",
    "load_definition",
    "load_solution",
    "load_workloads",
    "solution_from_python_file",
]
