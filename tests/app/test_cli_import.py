"""`kaudit problems import`: a generated SOL-ExecBench dataset tree into a catalogue folder (the tables, the exit
codes, the refusals), then `kaudit audit` against that catalogue by --catalogue and by --problem-dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from app.cli import app
from worker.dataset_import import provenance_of

WIDE = {"COLUMNS": "240"}  # rich folds table cells at the terminal's width; keep each name on one line


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


def _folder(
    folder: Path, definition: dict[str, object], workloads: list[dict[str, object]], *, traced: bool = False
) -> None:
    folder.mkdir(parents=True)
    (folder / "definition.json").write_text(json.dumps(definition))
    lines = [
        {"definition": definition["name"], "workload": w, "solution": None, "evaluation": None} if traced else w
        for w in workloads
    ]
    (folder / "workload.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _blob(path: str) -> dict[str, object]:
    return {"x": {"type": "safetensors", "path": path, "tensor_key": "x"}}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """Two definitions as the official dataset lays them out (category folders; one with a safetensors blob named
    from the dataset root, one with workload-trace lines and a blob that is missing), and one folder whose blob
    path leaves the dataset, which the import refuses."""
    root = tmp_path / "dataset"
    (root / "blobs").mkdir(parents=True)
    save_file({"x": torch.arange(32, dtype=torch.float32).reshape(4, 8)}, str(root / "blobs" / "x4.safetensors"))
    _folder(
        root / "L1" / "001_scale_two",
        _definition("scale_two", 2.0),
        [
            {"uuid": "two-r", "axes": {"n": 16}, "inputs": {"x": {"type": "random"}}},
            {"uuid": "two-blob", "axes": {"n": 4}, "inputs": _blob("blobs/x4.safetensors")},
        ],
    )
    _folder(
        root / "L2" / "002_scale_three",
        _definition("scale_three", 3.0),
        [
            {"uuid": "three-r", "axes": {"n": 8}, "inputs": {"x": {"type": "random"}}},
            {"uuid": "three-gone", "axes": {"n": 4}, "inputs": _blob("blobs/not_there.safetensors")},
        ],
        traced=True,
    )
    (tmp_path / "secret.safetensors").write_bytes(b"a file of the importing host")
    _folder(
        root / "L2" / "003_escapes",
        _definition("escapes", 4.0),
        [{"uuid": "e", "axes": {"n": 4}, "inputs": _blob("../secret.safetensors")}],
    )
    return root


def _solution(tmp_path: Path, definition: str, scale: float) -> Path:
    folder = tmp_path / "solution"
    folder.mkdir(exist_ok=True)
    (folder / "solution.json").write_text(
        json.dumps(
            {
                "name": "mine",
                "definition": definition,
                "spec": {"languages": ["pytorch"], "entry_point": "k.py::run", "destination_passing_style": False},
                "sources": [{"path": "k.py", "content": f"def run(x):\n    return x * {scale}\n"}],
            }
        )
    )
    return folder


def test_import_prints_what_was_imported_and_refused_and_exits_0(dataset: Path, tmp_path: Path) -> None:
    dest = tmp_path / "catalogue"
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--into", str(dest)], env=WIDE)
    assert r.exit_code == 0, r.stdout + r.stderr
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in r.stdout.splitlines()
        if line.count("│") >= 3
    }
    assert rows["scale_two"] == ["2", "1", "-"]  # workloads, blobs, missing blobs
    assert rows["scale_three"] == ["2", "0", "blobs/not_there.safetensors"]
    assert "L2/003_escapes" in rows and "no '..'" in rows["L2/003_escapes"][0], rows
    assert "2 imported, 1 refused" in r.stdout
    # the blob is copied in, byte for byte, and each folder is marked as imported (its reference untrusted)
    assert (dest / "scale_two/data/blobs/x4.safetensors").read_bytes() == (
        dataset / "blobs/x4.safetensors"
    ).read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == ["scale_three", "scale_two"]
    assert all((p := provenance_of(dest / n)) is not None and not p.reviewed for n in ("scale_two", "scale_three"))

    listed = CliRunner().invoke(app, ["problems", "--catalogue", str(dest), "--json"])
    assert listed.exit_code == 0 and {p["name"] for p in json.loads(listed.stdout)} == {"scale_two", "scale_three"}


def test_an_imported_catalogue_audits_by_catalogue_and_by_problem_dir(dataset: Path, tmp_path: Path) -> None:
    dest = tmp_path / "catalogue"
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--into", str(dest), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["does_not_load"] == {}, r.stdout + r.stderr
    good = _solution(tmp_path, "scale_two", 2.0)
    # by name, from the imported catalogue: the blob workload is read from the copy
    r = CliRunner().invoke(
        app, ["audit", str(good), "--catalogue", str(dest), "--stages", "intake,benchmark", "--json", "--seed", "1"]
    )
    assert r.exit_code == 0, r.stdout + r.stderr
    bench = next(s for s in json.loads(r.stdout)["stages"] if s["name"] == "benchmark")
    assert bench["status"] == "passed" and set(bench["metrics"]["workloads"]) == {"two-r", "two-blob"}
    # the shipped catalogue does not know it: the catalogue really came from --catalogue
    r = CliRunner().invoke(app, ["audit", str(good), "--stages", "intake"])
    assert r.exit_code == 2 and "unknown definition 'scale_two'" in r.stderr
    # one imported folder as --problem-dir, a .py file named with --definition against the catalogue
    r = CliRunner().invoke(
        app,
        [
            "audit",
            str(good),
            "--problem-dir",
            str(dest / "scale_two"),
            "--stages",
            "intake,benchmark",
            "--json",
            "--seed",
            "1",
        ],
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "pass", r.stdout + r.stderr
    kernel = tmp_path / "k3.py"  # the .py shorthand is destination-passing: run(x, y)
    kernel.write_text("def run(x, y):\n    y.copy_(x * 3.0)\n")
    r = CliRunner().invoke(
        app, ["audit", str(kernel), "-d", "scale_three", "--catalogue", str(dest), "--stages", "intake", "--json"]
    )
    assert r.exit_code == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["definition"] == "scale_three"


def test_nothing_imported_exits_1(tmp_path: Path, dataset: Path) -> None:
    only_refused = dataset / "L2"  # its one importable definition removed: only the refused folder is left
    for f in (only_refused / "002_scale_three").iterdir():
        f.unlink()
    (only_refused / "002_scale_three").rmdir()
    r = CliRunner().invoke(app, ["problems", "import", str(only_refused), "--into", str(tmp_path / "c")], env=WIDE)
    assert r.exit_code == 1 and "0 imported, 1 refused" in r.stdout, r.stdout + r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(app, ["problems", "import", str(empty), "--into", str(tmp_path / "c")])
    assert r.exit_code == 1 and "no definition.json" in r.stderr


def test_bad_input_and_a_missing_destination_exit_2(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAUDIT_CATALOGUE_ROOT", raising=False)
    r = CliRunner().invoke(app, ["problems", "import", str(dataset)])
    assert r.exit_code == 2 and "pass --into DIR, or set KAUDIT_CATALOGUE_ROOT" in r.stderr, r.stderr
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    monkeypatch.setenv("KAUDIT_CATALOGUE_ROOT", str(a_file))
    r = CliRunner().invoke(app, ["problems", "import", str(dataset)])
    assert r.exit_code == 2 and "KAUDIT_CATALOGUE_ROOT" in r.stderr and "--into" in r.stderr, r.stderr
    r = CliRunner().invoke(
        app, ["problems", "import", str(tmp_path / "no_such_dataset"), "--into", str(tmp_path / "c")]
    )
    assert r.exit_code == 2 and "not a folder" in r.stderr
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--into", str(dataset / "L1")])
    assert r.exit_code == 2 and "overlap" in r.stderr


def test_the_configured_catalogue_root_is_the_default_destination(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "configured"
    monkeypatch.setenv("KAUDIT_CATALOGUE_ROOT", str(root))
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["into"] == str(root), r.stdout + r.stderr
    # and `kaudit problems` (like the service) reads the catalogue from there
    listed = CliRunner().invoke(app, ["problems", "--json"])
    assert {p["name"] for p in json.loads(listed.stdout)} == {"scale_two", "scale_three"}


def test_a_folder_no_import_wrote_is_never_replaced(dataset: Path, tmp_path: Path) -> None:
    dest = tmp_path / "catalogue"
    curated = dest / "scale_two"
    curated.mkdir(parents=True)
    (curated / "definition.json").write_text(json.dumps(_definition("scale_two", 2.0)))
    (curated / "audit.json").write_text("{}")
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--into", str(dest)])
    assert r.exit_code == 2 and "scale_two" in r.stderr and "not imported" in r.stderr, r.stderr
    assert sorted(p.name for p in curated.iterdir()) == ["audit.json", "definition.json"]
    # an earlier import's folder is replaced, as a re-import should
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--into", str(tmp_path / "again")])
    assert r.exit_code == 0
    r = CliRunner().invoke(app, ["problems", "import", str(dataset), "--into", str(tmp_path / "again")])
    assert r.exit_code == 0, r.stderr
