"""`kaudit audit` on hostile input: exit 2 and one line on stderr, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
EXAMPLE = KERNELS / "embedding_backward/solutions/pytorch_fp32/solution.json"


def _bad(tmp_path: Path, case: str) -> Path:
    f = tmp_path / "solution.json"
    sol = json.loads(EXAMPLE.read_text())
    if case == "nested":  # json.loads recursed past its limit: RecursionError, a traceback and exit 1
        f.write_text(json.dumps(sol)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif case == "many_sources":  # the message listed every path
        sol["spec"]["entry_point"] = "missing.py::run"
        sol["sources"] += [{"path": f"p/{'d' * 200}{i}.py", "content": ""} for i in range(3000)]
        f.write_text(json.dumps(sol))
    elif case == "binary":
        f.write_bytes(b"\xff\xfe\x00" * 100)
    elif case == "unreadable_dir":
        f.mkdir()
        return f
    return f


@pytest.mark.parametrize("case", ["nested", "many_sources", "binary", "unreadable_dir"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    path = _bad(tmp_path, case)
    r = CliRunner().invoke(app, ["audit", str(path), "--stages", "intake"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exception, r.stdout, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and len(lines[0]) <= 2100, r.stderr[:3000]
