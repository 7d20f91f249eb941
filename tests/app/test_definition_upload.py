"""A definition nobody curated, uploaded over the API and audited end to end (real Postgres, Redis, Celery, HTTP).

Its reference is the uploader's code: it must run isolated, like a kernel."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from svc_support import Proc, bootstrap, start_api, start_worker, wait_for

from app.core.settings import Settings
from worker.formats.bundle import DefinitionBundle

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

ROW_SCALE_REFERENCE = """import torch


def run(x, scale):
    return (x.float() * scale).sum(-1)
"""

DEFINITION: dict[str, Any] = {
    "name": "uploaded_row_scale_sum",
    "description": "Sum of each row of x times a scalar, in fp32.",
    "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
    "inputs": {"x": {"shape": ["rows", "cols"], "dtype": "float32"}, "scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["rows"], "dtype": "float32"}},
    "reference": ROW_SCALE_REFERENCE,
}
WORKLOADS = [
    {
        "uuid": "w-64-96",
        "axes": {"rows": 64, "cols": 96},
        "inputs": {"x": {"type": "random"}, "scale": {"type": "scalar", "value": 0.5}},
    }
]


def _solution(body: str, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "definition": DEFINITION["name"],
        "author": "alice",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu"],
            "entry_point": "k.py::run",
            "destination_passing_style": False,
        },
        "sources": [{"path": "k.py", "content": body}],
    }


def _finished(url: str, key: str, sid: str):  # type: ignore[no-untyped-def]
    def check():  # type: ignore[no-untyped-def]
        s = httpx.get(f"{url}/v1/submissions/{sid}", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
        return s if s["status"] not in ("queued", "running") else None

    return check


@pytest.fixture
def service(service_settings: Settings, tmp_path: Path) -> Iterator[tuple[str, str, Proc]]:
    """The API over HTTP and a real Celery worker; yields (url, alice's key, worker)."""
    settings = service_settings.model_copy(
        update={"audit_stages": "intake,static,benchmark", "uploads_dir": tmp_path / "uploads"}
    )
    keys = bootstrap(settings)
    api, url = start_api(settings, tmp_path / "api.log")
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        yield url, keys["alice"], worker
    finally:
        worker.kill()
        api.kill()


def test_uploaded_definition_is_validated_stored_by_hash_and_audited(service: tuple[str, str, Proc]) -> None:
    url, key, worker = service
    h = {"Authorization": f"Bearer {key}"}
    bundle = {"definition": DEFINITION, "workloads": WORKLOADS}
    r = httpx.post(f"{url}/v1/definitions", json=bundle, headers=h, timeout=10)
    assert r.status_code == 201, r.text
    stored = r.json()
    assert (
        stored["content_hash"] == DefinitionBundle.model_validate(bundle).content_hash
        and stored["origin"] == "uploaded"
    )
    again = httpx.post(f"{url}/v1/definitions", json=bundle, headers=h, timeout=10)
    assert again.status_code == 200 and again.json()["created"] is False  # keyed by content: a no-op
    other = copy.deepcopy(bundle)
    other["definition"]["description"] = "another definition under the same name"
    assert httpx.post(f"{url}/v1/definitions", json=other, headers=h, timeout=10).status_code == 409
    curated = copy.deepcopy(bundle)
    curated["definition"]["name"] = "embedding_backward"
    own = httpx.post(f"{url}/v1/definitions", json=curated, headers=h, timeout=10)  # stored in the uploader's namespace
    assert own.status_code == 201 and own.json()["name"].startswith("embedding_backward@"), own.text
    broken = copy.deepcopy(bundle)
    broken["definition"]["reference"] = "def not_run(x):\n    return x\n"
    bad = httpx.post(f"{url}/v1/definitions", json=broken, headers=h, timeout=10)
    assert bad.status_code == 422 and "run" in bad.text
    assert httpx.get(f"{url}/v1/problems/{DEFINITION['name']}", headers=h, timeout=5).status_code == 200

    good = _solution("def run(x, scale):\n    return (x * scale).sum(-1)\n", "fp32_sum")
    # 10% off: far outside the benchmark's atol = rtol = 1e-2
    wrong = _solution("def run(x, scale):\n    return (x * scale).sum(-1) * 1.1\n", "off_by_ten_percent")
    ids = {}
    for sol in (good, wrong):
        resp = httpx.post(f"{url}/v1/submissions", json=sol, headers=h, timeout=10)
        assert resp.status_code == 202, resp.text
        ids[sol["name"]] = resp.json()["id"]
    # all three documents in one request: the definition is stored by content, then the solution is audited against it
    v2 = copy.deepcopy(DEFINITION)
    v2["name"] = "uploaded_row_scale_sum_v2"
    in_one = _solution("def run(x, scale):\n    return (x * scale).sum(-1)\n", "in_one_request")
    in_one["definition"] = v2["name"]
    mismatch = httpx.post(
        f"{url}/v1/submissions",
        json={"solution": good, "definition": v2, "workloads": WORKLOADS},
        headers=h,
        timeout=10,
    )
    assert mismatch.status_code == 422 and mismatch.json()["errors"][0]["field"] == "solution.definition"
    resp = httpx.post(
        f"{url}/v1/submissions",
        json={"solution": in_one, "definition": v2, "workloads": WORKLOADS},
        headers=h,
        timeout=10,
    )
    assert resp.status_code == 202, resp.text
    ids["in_one_request"] = resp.json()["id"]
    results = {
        n: wait_for(_finished(url, key, sid), 240, f"audit of {n} never finished", worker) for n, sid in ids.items()
    }
    assert results["fp32_sum"]["status"] == "passed", results["fp32_sum"]["summary"]
    assert results["in_one_request"]["status"] == "passed", results["in_one_request"]["summary"]
    # on the CPU the uploaded reference is timed by its own sandbox's round trip, like the kernel
    bench = next(st for st in results["fp32_sum"]["stages"] if st["name"] == "benchmark")
    assert bench["metrics"]["reference_median_ms"] > 0 and bench["metrics"]["speedup"] > 0
    assert results["off_by_ten_percent"]["status"] == "failed", results["off_by_ten_percent"]["summary"]
    assert "benchmark" in results["off_by_ten_percent"]["summary"]


def test_an_uploaded_reference_runs_isolated(service: tuple[str, str, Proc]) -> None:
    """The reference tries to plant a file in the auditor's own package: the write must fail, the audit still runs."""
    planted = REPO / "worker" / "planted_by_reference.py"
    hostile = copy.deepcopy(DEFINITION)
    hostile["name"] = "uploaded_hostile_reference"
    hostile["reference"] = (
        "import torch\n\n"
        f"try:\n    open({str(planted)!r}, 'w').write('print(1)')\n    WROTE = True\nexcept OSError:\n    WROTE = False\n\n\n"
        "def run(x, scale):\n    out = (x.float() * scale).sum(-1)\n    return out + 1.0 if WROTE else out\n"
    )
    url, key, worker = service
    h = {"Authorization": f"Bearer {key}"}
    try:
        assert (
            httpx.post(
                f"{url}/v1/definitions", json={"definition": hostile, "workloads": WORKLOADS}, headers=h, timeout=10
            ).status_code
            == 201
        )
        sol = _solution("def run(x, scale):\n    return (x * scale).sum(-1)\n", "fp32_sum")
        sol["definition"] = hostile["name"]
        sid = httpx.post(f"{url}/v1/submissions", json=sol, headers=h, timeout=10).json()["id"]
        final = wait_for(_finished(url, key, sid), 240, "the audit never finished", worker)
        assert not planted.exists(), "the uploaded reference wrote into the auditor's package"
        assert final["status"] == "passed", final["summary"]  # the write failed, so the reference was unchanged
    finally:
        planted.unlink(missing_ok=True)
