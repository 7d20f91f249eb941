"""A SOL-ExecBench dataset tree loaded into the catalogue in one step (worker.dataset_import), on a generated tree of
24 definitions laid out as the official dataset is: category folders, one folder per definition, workloads bare or
as workload traces, safetensors blobs named relative to the dataset root."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from worker.catalogue import load_catalogue
from worker.dataset_import import import_dataset
from worker.engine import run_audit
from worker.formats import Solution
from worker.stages.result import StageStatus

CATEGORIES = ("L1", "L2", "FlashInfer-Bench")


def _definition(name: str, scale: float) -> dict[str, object]:
    return {
        "name": name,
        "op_type": "elementwise",
        "description": f"x times {scale}",
        "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 8}},
        "inputs": {"x": {"shape": ["n", "d"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n", "d"], "dtype": "float32"}},
        "reference": f"import torch\n\n\ndef run(x):\n    return x * {scale}\n",
    }


def _write(
    folder: Path,
    definition: dict[str, object],
    workloads: list[dict[str, object]],
    *,
    traced: bool = False,
    reference_file: bool = False,
) -> None:
    folder.mkdir(parents=True)
    if reference_file:
        (folder / "reference.py").write_text(str(definition["reference"]))
        definition = {k: v for k, v in definition.items() if k != "reference"}
    (folder / "definition.json").write_text(json.dumps(definition))
    lines = [
        {"definition": definition["name"], "workload": w, "solution": None, "evaluation": None} if traced else w
        for w in workloads
    ]
    (folder / "workload.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    (root / "blobs").mkdir(parents=True)
    save_file({"x": torch.arange(32, dtype=torch.float32).reshape(4, 8)}, str(root / "blobs" / "x4.safetensors"))
    (tmp_path / "secret.safetensors").write_bytes(b"host file")
    for i in range(24):
        name = f"scale_{i:02d}"
        w = [{"uuid": f"{name}-r", "axes": {"n": 16}, "inputs": {"x": {"type": "random"}}}]
        if i % 4 == 0:
            w.append(
                {
                    "uuid": f"{name}-blob",
                    "axes": {"n": 4},
                    "inputs": {"x": {"type": "safetensors", "path": "blobs/x4.safetensors", "tensor_key": "x"}},
                }
            )
        _write(
            root / CATEGORIES[i % 3] / f"{i:03d}_{name}",
            _definition(name, 1.0 + i),
            w,
            traced=i % 2 == 1,
            reference_file=i % 5 == 0,
        )
    blob = {"type": "safetensors", "tensor_key": "x"}
    _write(
        root / "L1" / "missing_blob",
        _definition("missing_blob", 2.0),
        [{"uuid": "m", "axes": {"n": 4}, "inputs": {"x": {**blob, "path": "blobs/not_there.safetensors"}}}],
    )
    _write(
        root / "L1" / "escapes",
        _definition("escapes", 2.0),
        [{"uuid": "e", "axes": {"n": 4}, "inputs": {"x": {**blob, "path": "../secret.safetensors"}}}],
    )
    os.symlink(tmp_path / "secret.safetensors", root / "blobs" / "link.safetensors")
    _write(
        root / "L2" / "links_out",
        _definition("links_out", 2.0),
        [{"uuid": "l", "axes": {"n": 4}, "inputs": {"x": {**blob, "path": "blobs/link.safetensors"}}}],
    )
    _write(
        root / "L2" / "duplicate",
        _definition("scale_03", 9.0),
        [{"uuid": "d", "axes": {"n": 4}, "inputs": {"x": {"type": "random"}}}],
    )
    return root


def test_a_dataset_tree_imports_into_a_catalogue_that_loads(dataset: Path, tmp_path: Path) -> None:
    dest = tmp_path / "catalogue"
    report = import_dataset(dataset, dest)
    names = sorted(p.name for p in report.imported)
    assert len(names) == 25 and "missing_blob" in names
    assert set(report.refused) == {"L1/escapes", "L2/links_out", "L2/duplicate"}, report.refused
    assert "no '..'" in report.refused["L1/escapes"] or "leaves the dataset root" in report.refused["L1/escapes"]
    assert "outside the dataset root" in report.refused["L2/links_out"]
    assert "also" in report.refused["L2/duplicate"]
    missing = next(p for p in report.imported if p.name == "missing_blob")
    assert missing.missing_blobs == ["blobs/not_there.safetensors"]
    assert not any(b"host file" in p.read_bytes() for p in dest.rglob("*.safetensors")), "a host file was copied in"

    catalogue = load_catalogue(dest)
    assert sorted(catalogue.problems) == names
    p = catalogue.get("scale_05")
    assert "x * 6.0" in p.definition.reference, "the reference in reference.py beside the definition is read"
    assert len(catalogue.get("scale_04").workloads("gpu")) == 2
    # third-party code: every imported reference runs in its sandbox until reviewed
    assert not any(p.reference_trusted for p in catalogue)


def test_an_imported_problem_audits_with_its_blob_and_a_missing_blob_is_named(dataset: Path, tmp_path: Path) -> None:
    catalogue = load_catalogue(import_dataset(dataset, tmp_path / "catalogue") and tmp_path / "catalogue")
    good = Solution.model_validate(
        {
            "name": "k",
            "definition": "scale_04",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": False},
            "sources": [{"path": "k.py", "content": "def run(x):\n    return x * 5.0\n"}],
        }
    )
    report = run_audit(catalogue.get("scale_04"), good, stages=["intake", "benchmark"], seed=1)
    bench = next(s for s in report.stages if s.name == "benchmark")
    assert bench.status is StageStatus.passed, bench.summary
    assert set(bench.metrics["workloads"]) == {"scale_04-r", "scale_04-blob"}

    missing = good.model_copy(update={"definition": "missing_blob"})
    report = run_audit(catalogue.get("missing_blob"), missing, stages=["intake", "benchmark"], seed=1)
    bench = next(s for s in report.stages if s.name == "benchmark")
    assert bench.status is StageStatus.error
    assert "missing input file 'data/blobs/not_there.safetensors'" in bench.summary
