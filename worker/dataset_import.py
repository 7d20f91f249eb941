"""Load a SOL-ExecBench dataset tree into the catalogue, in one step.

A dataset holds one folder per definition, at any depth (`<category>/<problem>/`), each with `definition.json`
(the reference inline, or in a `reference.py` beside it), and `workload.jsonl` whose lines are workloads, bare or
wrapped as workload traces (`{"definition": ..., "workload": {...}, "solution": null, "evaluation": null}`).
Safetensors inputs name files by paths relative to the dataset root.

Each definition becomes a catalogue folder under `dest/<name>/`: the documents, the blobs its workloads read
(copied in, under `data/`, so the folder stands alone), and `provenance.json`. A blob path that leaves the
dataset root (`..`, an absolute path, a symbolic link pointing out) is refused: an import must never read the
importing host's files. A blob that is simply missing is kept as a reference and reported; an audit of that
workload then ends with a "missing input file" error naming it.

An imported reference is third-party code: its provenance marks it untrusted, so it runs in its own sandbox like
an uploaded one (worker.sandboxed_reference), until someone reviews it and sets `reviewed: true`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import BaseModel, Field

from worker.formats import Definition
from worker.formats.exceptions import FormatError
from worker.formats.loaders import load_definition, load_workloads, parse_model

PROVENANCE = "provenance.json"
BLOBS = "data"
MAX_DEPTH = 4


class Provenance(BaseModel):
    """Where a catalogue folder came from, and whether its reference may run in the trusted process."""

    source: str = Field(description="'imported': from a dataset tree")
    dataset_path: str = Field(description="the folder it was imported from, relative to the dataset root")
    reviewed: bool = Field(False, description="true once a person has reviewed the reference: it then runs trusted")


class ImportedProblem(BaseModel):
    name: str
    folder: str
    workloads: int
    blobs: int
    missing_blobs: list[str] = Field(default_factory=list)


class ImportReport(BaseModel):
    imported: list[ImportedProblem] = Field(default_factory=list)
    refused: dict[str, str] = Field(default_factory=dict, description="dataset folder -> why it was not imported")


def problem_folders(root: Path) -> list[Path]:
    """Every folder under `root` (at most MAX_DEPTH down, no symbolic links followed) with a definition.json."""
    out: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if (d / "definition.json").is_file():
            out.append(d)
            return
        if depth >= MAX_DEPTH:
            return
        for child in sorted(d.iterdir()):
            if child.is_dir() and not child.is_symlink() and not child.name.startswith("."):
                walk(child, depth + 1)

    walk(root, 0)
    return out


def _inside(root: Path, rel: str) -> Path:
    """`rel` resolved under `root`, refused if it leaves it (after following links)."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise ValueError(f"blob path '{rel}' leaves the dataset root")
    full = (root / p).resolve()
    if full != root and root not in full.parents:
        raise ValueError(f"blob path '{rel}' leads outside the dataset root (a symbolic link)")
    return full


def _definition(folder: Path) -> Definition:
    raw = json.loads((folder / "definition.json").read_text())
    if isinstance(raw, dict) and not raw.get("reference") and (folder / "reference.py").is_file():
        raw["reference"] = (folder / "reference.py").read_text()
        return parse_model(Definition, raw, str(folder / "definition.json"))
    return load_definition(folder / "definition.json")


def import_problem(root: Path, folder: Path, dest: Path) -> ImportedProblem:
    definition = _definition(folder)
    wpath = folder / "workload.jsonl"
    workloads = load_workloads(wpath, definition.name) if wpath.is_file() else []
    if not workloads:
        raise FormatError(str(wpath), ["no workloads"])
    target = dest / definition.name
    if target.exists() and provenance_of(target) is None:
        raise ValueError(f"'{target}' is a catalogue folder no import wrote: not replaced")
    staging = dest / f".{definition.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / BLOBS).mkdir(parents=True)
    copied: dict[str, str] = {}
    missing: list[str] = []
    rewritten = []
    for w in workloads:
        raw = w.model_dump(mode="json", exclude_none=True)
        for spec in raw.get("inputs", {}).values():
            if spec.get("type") != "safetensors":
                continue
            rel = str(spec["path"])
            src = _inside(root, rel)
            if rel not in copied:
                if src.is_file():
                    dst = staging / BLOBS / Path(rel)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dst)
                else:
                    missing.append(rel)
                copied[rel] = f"{BLOBS}/{Path(rel).as_posix()}"
            spec["path"] = copied[rel]
        rewritten.append(raw)
    (staging / "definition.json").write_text(
        json.dumps(definition.model_dump(mode="json", exclude_none=True), indent=1)
    )
    (staging / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in rewritten))
    provenance = Provenance(source="imported", dataset_path=folder.relative_to(root).as_posix() or ".")
    (staging / PROVENANCE).write_text(provenance.model_dump_json(indent=1))
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return ImportedProblem(
        name=definition.name,
        folder=str(target),
        workloads=len(workloads),
        blobs=len(copied) - len(missing),
        missing_blobs=missing,
    )


def import_dataset(root: Path, dest: Path) -> ImportReport:
    """Every definition folder under `root` into `dest` (see the module docstring)."""
    root = root.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    report = ImportReport()
    seen: dict[str, str] = {}
    for folder in problem_folders(root):
        rel = folder.relative_to(root).as_posix() or "."
        try:
            name = _definition(folder).name
            if name in seen:
                raise ValueError(f"the definition name '{name}' is also {seen[name]}'s")
            seen[name] = rel
            report.imported.append(import_problem(root, folder, dest))
        except (FormatError, ValueError, OSError) as err:
            report.refused[rel] = str(err)[:500]
    return report


def provenance_of(folder: Path) -> Provenance | None:
    p = folder / PROVENANCE
    if not p.is_file():
        return None
    return Provenance.model_validate_json(p.read_text())
