"""POST /v1/problems/import: a SOL-ExecBench dataset tree on the server's disk into the catalogue (admin only), then
synced, so its problems can be audited at once (real Postgres)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from svc_support import bootstrap

from app.core.settings import Settings
from app.main import create_app

pytestmark = pytest.mark.services

DEFINITION = {
    "name": "imported_double",
    "op_type": "elementwise",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
    "reference": "def run(x):\n    return x * 2\n",
}


@pytest.fixture
def api(service_settings: Settings, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], Path]]:
    catalogue = tmp_path / "catalogue"
    shutil.copytree(Path(__file__).resolve().parents[2] / "kernels" / "cumsum", catalogue / "cumsum")
    settings = service_settings.model_copy(update={"catalogue_root": catalogue})
    keys = bootstrap(settings)
    dataset = tmp_path / "dataset" / "L1" / "double"
    dataset.mkdir(parents=True)
    (dataset / "definition.json").write_text(json.dumps(DEFINITION))
    (dataset / "workload.jsonl").write_text(
        json.dumps(
            {
                "definition": "imported_double",
                "solution": None,
                "evaluation": None,
                "workload": {"uuid": "w", "axes": {"n": 64}, "inputs": {"x": {"type": "random"}}},
            }
        )
        + "\n"
    )
    with TestClient(create_app(settings)) as client:
        yield client, keys, tmp_path / "dataset"


def test_an_admin_imports_a_dataset_and_its_problems_are_listed(api: tuple[TestClient, dict[str, str], Path]) -> None:
    client, keys, dataset = api
    body = {"path": str(dataset)}
    denied = client.post("/v1/problems/import", json=body, headers={"Authorization": f"Bearer {keys['alice']}"})
    assert denied.status_code == 403
    admin = {"Authorization": f"Bearer {keys['admin']}"}
    r = client.post("/v1/problems/import", json=body, headers=admin)
    assert r.status_code == 200, r.text
    assert [p["name"] for p in r.json()["report"]["imported"]] == ["imported_double"]
    assert "imported_double" in r.json()["sync"]["added"]
    names = {p["name"] for p in client.get("/v1/problems", headers=admin).json()}
    assert "imported_double" in names


@pytest.mark.parametrize("path", ["relative/path", "/no/such/folder"])
def test_a_bad_path_is_422_with_a_message(api: tuple[TestClient, dict[str, str], Path], path: str) -> None:
    client, keys, _ = api
    r = client.post("/v1/problems/import", json={"path": path}, headers={"Authorization": f"Bearer {keys['admin']}"})
    assert r.status_code == 422 and "absolute path" in r.text
