"""Token statistics sent with a submission (bring your own distribution): accepted in JSON (base64) and multipart,
validated at POST by the engine's reader, stored with the submission, shown by kind, size and sha256 (never the
bytes); bad ones answered 422 naming the field, oversize ones 413, and nothing stored for either."""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_api
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from svc_support import bootstrap, example
from test_api import auth

from app.main import create_app
from app.models import Submission, SubmissionTokenStats

# the API fixtures of test_api.py (sqlite_api: SQLite only; api: SQLite and Postgres)
api = test_api.api
sqlite_api = test_api.sqlite_api


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _body(data: bytes, **fields: Any) -> dict[str, Any]:
    return {
        **example("pytorch_fp32"),
        "token_stats": {"format": "npy", "data_base64": base64.b64encode(data).decode(), **fields},
    }


def _errors(r) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    body = r.json()
    assert set(body) == {"detail", "errors"}, body
    return list(body["errors"])


def _count(client, model) -> int:  # type: ignore[no-untyped-def]
    with client.app.state.services.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(model)))


def test_submit_with_token_stats_stores_them_and_the_view_shows_them(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    ids = _npy((np.arange(5000) * 31 % 700).astype(np.int32))
    r = client.post("/v1/submissions", json=_body(ids), headers=auth(keys["alice"]))
    assert r.status_code == 202, r.text
    view = client.get(r.json()["status_url"], headers=auth(keys["alice"])).json()
    sha = hashlib.sha256(ids).hexdigest()
    assert view["token_stats"] == {
        "kind": "sample",
        "requested_kind": "auto",
        "format": "npy",
        "key": None,
        "entries": 5000,
        "size_bytes": len(ids),
        "sha256": sha,
        "source": f"token_stats sent with the submission (npy, sha256 {sha[:16]})",
    }
    assert "data_base64" not in r.text + str(view)
    with client.app.state.services.sessions() as s:
        row = s.get(SubmissionTokenStats, r.json()["id"])
        assert row is not None and row.data == ids and row.kind == "sample"
        sub = s.get(Submission, r.json()["id"])
        assert sub is not None and "token_stats" not in sub.source  # the solution is stored as the solution alone
    # a histogram (kind given)
    hist = _npy(np.ones(300, dtype=np.float32))
    r2 = client.post("/v1/submissions", json=_body(hist, kind="histogram"), headers=auth(keys["alice"]))
    assert r2.status_code == 202, r2.text
    v2 = client.get(r2.json()["status_url"], headers=auth(keys["alice"])).json()["token_stats"]
    assert v2["kind"] == "histogram" and v2["entries"] == 300
    # without token_stats: null, as before
    plain = client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth(keys["alice"]))
    assert client.get(plain.json()["status_url"], headers=auth(keys["alice"])).json()["token_stats"] is None


def test_token_stats_beside_a_definition_sent_in_the_same_request(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    from test_definition_upload import DEFINITION, WORKLOADS, _solution

    client, keys, _ = sqlite_api
    ids = _npy(np.arange(64, dtype=np.int64))
    body = {
        "solution": _solution("def run(x, scale):\n    return (x * scale).sum(-1)\n", "k"),
        "definition": DEFINITION,
        "workloads": WORKLOADS,
        "token_stats": {"format": "npy", "data_base64": base64.b64encode(ids).decode()},
    }
    r = client.post("/v1/submissions", json=body, headers=auth(keys["alice"]))
    assert r.status_code == 202, r.text
    view = client.get(r.json()["status_url"], headers=auth(keys["alice"])).json()
    # an upload lives in its uploader's namespace: name@namespace
    assert view["problem"].startswith(DEFINITION["name"] + "@") and view["token_stats"]["entries"] == 64


def test_multipart_upload_takes_a_token_stats_file(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = sqlite_api
    src = example("pytorch_fp32")["sources"][0]["content"].encode()
    hist = _npy(np.arange(1, 101, dtype=np.int64))
    r = client.post(
        "/v1/submissions",
        files={"file": ("k.py", src), "token_stats": ("counts.npy", hist)},
        data={"definition": "embedding_backward", "token_stats_kind": "histogram"},
        headers=auth(keys["alice"]),
    )
    assert r.status_code == 202, r.text
    view = client.get(r.json()["status_url"], headers=auth(keys["alice"])).json()["token_stats"]
    assert view["kind"] == view["requested_kind"] == "histogram" and view["sha256"] == hashlib.sha256(hist).hexdigest()
    bad = client.post(
        "/v1/submissions",
        files={"file": ("k.py", src), "token_stats": ("ids.csv", b"1,2,3")},
        data={"definition": "embedding_backward"},
        headers=auth(keys["alice"]),
    )
    assert bad.status_code == 422 and _errors(bad)[0]["field"] == "token_stats"
    assert ".npy or .safetensors" in _errors(bad)[0]["reason"]
    kind = client.post(
        "/v1/submissions",
        files={"file": ("k.py", src), "token_stats": ("ids.npy", hist)},
        data={"definition": "embedding_backward", "token_stats_kind": "zipf"},
        headers=auth(keys["alice"]),
    )
    assert kind.status_code == 422 and _errors(kind)[0]["field"] == "token_stats_kind"


def test_idempotency_key_covers_the_token_stats(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = sqlite_api
    h = {**auth(keys["alice"]), "Idempotency-Key": "ts-1"}
    first = client.post("/v1/submissions", json=_body(_npy(np.arange(100))), headers=h)
    again = client.post("/v1/submissions", json=_body(_npy(np.arange(100))), headers=h)
    assert first.status_code == again.status_code == 202 and again.json()["idempotent_replay"] is True
    assert client.post("/v1/submissions", json=_body(_npy(np.arange(101))), headers=h).status_code == 409
    assert client.post("/v1/submissions", json=example("pytorch_fp32"), headers=h).status_code == 409
    assert _count(client, SubmissionTokenStats) == 1


@pytest.mark.parametrize(
    ("mutate", "field", "needle"),
    [
        (lambda ts: ts.update(data_base64="not base64!!"), "token_stats.data_base64", "not valid base64"),
        (lambda ts: ts.update(data_base64="QUJ"), "token_stats.data_base64", "not valid base64"),
        (lambda ts: ts.update(kind="zipf"), "token_stats.kind", "'auto', 'histogram' or 'sample'"),
        (lambda ts: ts.update(format="csv"), "token_stats.format", "'npy' or 'safetensors'"),
        (lambda ts: ts.update(extra=1), "token_stats.extra", "Extra inputs are not permitted"),
        (lambda ts: ts.pop("format"), "token_stats.format", "Field required"),
        (lambda ts: ts.update(key="ids"), "token_stats.key", "a .npy file holds one array"),
        (
            lambda ts: ts.update(kind="sample", data_base64=base64.b64encode(_npy(np.array([0.5, 2.0]))).decode()),
            "token_stats.kind",
            "must be an integer array",
        ),
        (
            lambda ts: ts.update(data_base64=base64.b64encode(_npy(np.ones((3, 3), dtype=np.int32))).decode()),
            "token_stats.data_base64",
            "non-empty 1-D array",
        ),
        (
            lambda ts: ts.update(data_base64=base64.b64encode(_npy(np.array([3, -1]))).decode()),
            "token_stats.data_base64",
            "must be >= 0",
        ),
        (lambda ts: ts.update(format="safetensors"), "token_stats.data_base64", "not a readable safetensors file"),
    ],
)
def test_bad_token_stats_are_422_naming_the_field(sqlite_api, mutate, field: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = sqlite_api
    body = _body(_npy(np.arange(50)))
    mutate(body["token_stats"])
    r = client.post("/v1/submissions", json=body, headers=auth(keys["alice"]))
    assert r.status_code == 422, r.text
    errors = _errors(r)
    assert errors[0]["field"] == field and needle in errors[0]["reason"], errors
    assert _count(client, Submission) == 0 and _count(client, SubmissionTokenStats) == 0


def test_token_stats_not_an_object_is_422(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = sqlite_api
    r = client.post(
        "/v1/submissions", json={**example("pytorch_fp32"), "token_stats": "ids.npy"}, headers=auth(keys["alice"])
    )
    assert r.status_code == 422 and _errors(r)[0]["field"] == "token_stats"


def test_oversize_token_stats_are_413_and_the_solution_keeps_its_own_limit(sqlite_settings) -> None:  # type: ignore[no-untyped-def]
    settings = sqlite_settings.model_copy(update={"token_stats_max_bytes": 4096})
    keys = bootstrap(settings)
    with TestClient(create_app(settings)) as client:
        h = auth(keys["alice"])
        ok = client.post("/v1/submissions", json=_body(_npy(np.arange(400, dtype=np.int64))), headers=h)  # 3328 bytes
        assert ok.status_code == 202, ok.text
        r = client.post("/v1/submissions", json=_body(_npy(np.arange(600, dtype=np.int64))), headers=h)  # 4928 bytes
        assert r.status_code == 413, r.text
        assert (
            _errors(r)[0]["field"] == "token_stats.data_base64"
            and "4928 bytes; at most 4096" in _errors(r)[0]["reason"]
        )
        src = example("pytorch_fp32")["sources"][0]["content"].encode()
        r = client.post(
            "/v1/submissions",
            files={"file": ("k.py", src), "token_stats": ("ids.npy", _npy(np.arange(600)))},
            data={"definition": "embedding_backward"},
            headers=h,
        )
        assert r.status_code == 413 and _errors(r)[0]["field"] == "token_stats"
        # far past the route's limit (solution limit + base64 of the statistics' limit): refused before it is read
        r = client.post("/v1/submissions", json=_body(b"\x00" * (settings.submission_body_limit_bytes)), headers=h)
        assert r.status_code == 413 and _errors(r)[0]["field"] == "(body)"
        # the solution itself is still held to body_limit_bytes when statistics come with it
        big = _body(_npy(np.arange(10)))
        big["description"] = "x" * (settings.body_limit_bytes + 1)
        r = client.post("/v1/submissions", json=big, headers=h)
        assert r.status_code == 413 and "without token_stats.data_base64" in _errors(r)[0]["reason"]
        assert _count(client, Submission) == 1


def test_a_large_sample_passes_the_routes_own_body_limit(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    """Token statistics over the 1 MiB solution limit are accepted (up to KAUDIT_TOKEN_STATS_MAX_BYTES); other
    routes and other content types keep the 1 MiB limit."""
    client, keys, settings = sqlite_api
    ids = _npy(np.random.default_rng(1).integers(0, 50_000, size=400_000, dtype=np.int64))  # 3.2 MB, 4.3 MB in base64
    r = client.post("/v1/submissions", json=_body(ids), headers=auth(keys["alice"]))
    assert r.status_code == 202, r.text[:300]
    assert client.get(r.json()["status_url"], headers=auth(keys["alice"])).json()["token_stats"]["entries"] == 400_000
    r = client.post(
        "/v1/api-keys", json={"submitter": "x" * (2 * settings.body_limit_bytes)}, headers=auth(keys["admin"])
    )
    assert r.status_code == 413


def test_the_api_validates_token_stats_without_importing_torch(tmp_path: Path) -> None:
    """README: the API process never imports torch; reading an upload goes through numpy and safetensors only."""
    code = f"""
import base64, io, sys
sys.path.insert(0, "tests/app")
import numpy as np
from fastapi.testclient import TestClient
from svc_support import bootstrap, example
from app.core.settings import Settings
from app.main import create_app
s = Settings(database_url="sqlite:///{tmp_path}/k.db", redis_url=None, broker_url="filesystem://",
             broker_dir="{tmp_path}/broker", rate_limit_storage_url="memory://", audit_stages="intake")
keys = bootstrap(s)
buf = io.BytesIO(); np.save(buf, np.arange(100))
body = {{**example("pytorch_fp32"), "token_stats": {{"format": "npy", "data_base64": base64.b64encode(buf.getvalue()).decode()}}}}
with TestClient(create_app(s)) as c:
    r = c.post("/v1/submissions", json=body, headers={{"Authorization": "Bearer " + keys["alice"]}})
    assert r.status_code == 202, r.text
print("torch" in sys.modules)
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
