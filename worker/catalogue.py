"""The problem catalogue: one self-describing folder per problem under kernels/.

A problem folder holds:
  definition.json        upstream SOL-ExecBench definition, unchanged
  workload.jsonl         the benchmark's workloads (GPU-sized)
  workload_cpu.jsonl     the same kinds of workload, CPU-sized
  audit.json             kernel-audit's additions (worker.problem_spec.AuditSpec); optional
  oracle.py              trusted fp64 implementation; optional
Without audit.json the probes are derived from the definition (worker.generic); without oracle.py
the oracle is the definition's reference promoted to fp64 (worker.generic.promote).
  solutions/<name>/solution.json   example solutions, good and known-bad
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from worker.formats import (
    Definition,
    Solution,
    Workload,
    load_definition,
    load_solution,
    load_workloads,
)
from worker.formats.exceptions import FormatError
from worker.formats.loaders import parse_model
from worker.problem_spec import AuditSpec

if TYPE_CHECKING:  # the service imports the catalogue without torch
    from worker.probes.token_stats import LoadedTokenStats

Profile = Literal["cpu", "gpu"]

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "kernels"


@dataclass(frozen=True)
class Problem:
    folder: Path
    definition: Definition
    workloads_gpu: tuple[Workload, ...]
    workloads_cpu: tuple[Workload, ...]
    spec: AuditSpec
    curated: bool = True
    generic_oracle: bool = False  # True: ignore oracle.py (measure what the generic path alone does)
    # the user's token statistics for this audit (bring your own distribution); None: the built-in text
    token_stats: LoadedTokenStats | None = None
    # False for an uploaded definition: its reference is the uploader's code and runs isolated
    reference_trusted: bool = True

    @property
    def name(self) -> str:
        return self.definition.name

    def with_token_stats(self, stats: LoadedTokenStats | None) -> "Problem":
        return replace(self, token_stats=stats)

    def as_uncurated(self) -> "Problem":
        """The same problem as if its folder had no audit.json and no oracle.py."""
        return replace(self, spec=AuditSpec(), curated=False, generic_oracle=True)

    @property
    def has_oracle(self) -> bool:
        return not self.generic_oracle and (self.folder / self.spec.oracle.split("::")[0]).is_file()

    def workloads(self, profile: Profile) -> tuple[Workload, ...]:
        return self.workloads_gpu if profile == "gpu" else self.workloads_cpu

    @cached_property
    def content_hash(self) -> str:
        """Changes whenever anything that decides an audit changes (definition, workloads, spec, oracle)."""
        h = hashlib.sha256()
        for fname in ("definition.json", "workload.jsonl", "workload_cpu.jsonl", "audit.json", "oracle.py"):
            p = self.folder / fname
            if p.exists():
                h.update(fname.encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()

    def oracle(self, reference: Any = None, device: str = "cpu") -> Callable[..., tuple[object, ...]]:
        """oracle.py where the folder has one; otherwise the reference promoted to fp64 (a GenericOracle, run on
        `device` where that keeps its result: see GenericOracle).

        `reference` is the audit's own reference object: an uploaded definition's runs isolated
        (worker.sandboxed_reference), and its source must never be executed here."""
        if not self.has_oracle:
            from worker.generic.promote import GenericOracle
            from worker.reference import Reference

            if reference is None:
                if not self.reference_trusted:
                    raise ValueError(f"{self.name}: an uploaded reference runs only in its sandbox; pass it in")
                reference = Reference.of(self.definition)
            return GenericOracle(reference, device=device)
        file, func = self.spec.oracle.split("::")
        module = _load_module(self.folder / file, f"kaudit_oracle_{self.name}")
        return getattr(module, func)

    def example_solutions(self) -> dict[str, Solution]:
        out: dict[str, Solution] = {}
        for p in sorted((self.folder / "solutions").glob("*/solution.json")):
            out[p.parent.name] = load_solution(p)
        return out

    def example_solution(self, name: str) -> Solution:
        return load_solution(self.folder / "solutions" / name / "solution.json")


def _load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FormatError(str(path), ["cannot import"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_problem(folder: Path) -> Problem:
    definition = load_definition(folder / "definition.json")
    spec_path = folder / "audit.json"
    spec = (
        parse_model(AuditSpec, json.loads(spec_path.read_text()), str(spec_path)) if spec_path.exists() else AuditSpec()
    )
    gpu = tuple(load_workloads(folder / "workload.jsonl", definition.name))
    cpu_path = folder / "workload_cpu.jsonl"
    cpu = tuple(load_workloads(cpu_path, definition.name)) if cpu_path.exists() else gpu
    for w in (*gpu, *cpu):
        unknown = set(w.inputs) - set(definition.inputs)
        if unknown:
            raise FormatError(str(folder), [f"workload {w.uuid}: inputs {sorted(unknown)} not in the definition"])
    # an imported dataset's reference is third-party code until reviewed (worker.dataset_import)
    from worker.dataset_import import provenance_of

    provenance = provenance_of(folder)
    return Problem(
        folder=folder,
        definition=definition,
        workloads_gpu=gpu,
        workloads_cpu=cpu,
        spec=spec,
        curated=spec_path.exists(),
        reference_trusted=provenance is None or provenance.reviewed,
    )


@dataclass(frozen=True)
class Catalogue:
    problems: dict[str, Problem]

    def get(self, name: str) -> Problem:
        try:
            return self.problems[name]
        except KeyError:
            known = ", ".join(sorted(self.problems))
            raise KeyError(f"unknown definition '{name}'; known: {known}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.problems

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.problems.values())


def load_catalogue(root: Path = DEFAULT_ROOT) -> Catalogue:
    problems = {}
    for d in sorted(root.iterdir()):
        # a dot-folder is an import or upload still being written (worker.dataset_import, worker.uploaded)
        if not d.name.startswith(".") and (d / "definition.json").exists():
            p = load_problem(d)
            problems[p.name] = p
    return Catalogue(problems=problems)
