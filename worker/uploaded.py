"""An uploaded definition as a Problem: its documents written to a folder keyed by their content hash,
loaded like any catalogue folder (no audit.json, no oracle.py: the generic path), with its reference
marked untrusted so that it runs isolated (worker.sandboxed_reference)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from worker.catalogue import Problem, load_problem
from worker.formats.bundle import DefinitionBundle


def _jsonl(workloads: list) -> str:  # type: ignore[type-arg]
    return "".join(json.dumps(w.model_dump(mode="json", exclude_none=True)) + "\n" for w in workloads)


def problem_from_bundle(bundle: DefinitionBundle, root: Path, *, trusted_reference: bool = False) -> Problem:
    folder = root / bundle.content_hash
    if not (folder / "definition.json").exists():
        tmp = root / f".{bundle.content_hash}.partial"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "definition.json").write_text(json.dumps(bundle.definition.model_dump(mode="json"), indent=1))
        (tmp / "workload.jsonl").write_text(_jsonl(bundle.workloads))
        (tmp / "workload_cpu.jsonl").write_text(_jsonl(bundle.workloads_cpu or bundle.workloads))
        try:
            tmp.rename(folder)  # atomic: another worker process may be doing the same
        except OSError:
            if not (folder / "definition.json").exists():
                raise
    problem = load_problem(folder)
    return replace(problem, curated=False, reference_trusted=trusted_reference)
