"""The HTTP API in-process (no worker): auth, validation, limits, idempotency, problems, re-audit, leaderboard."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from svc_support import bootstrap, drop_queue, example

from app.auth.keys import create_api_key
from app.core.settings import Settings
from app.main import create_app
from app.models import ApiKey, Audit, Submission


@pytest.fixture(params=["sqlite", "postgres"])
def api(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[TestClient, dict[str, str], Settings]]:  # type: ignore[no-untyped-def]
    settings: Settings = request.getfixturevalue("sqlite_settings" if request.param == "sqlite" else "service_settings")
    keys = bootstrap(settings)
    app = create_app(settings)
    with TestClient(app) as client:
        yield client, keys, settings


@pytest.fixture
def sqlite_api(sqlite_settings: Settings) -> Iterator[tuple[TestClient, dict[str, str], Settings]]:
    """The API on the embedded default's storage only: for behaviour that does not depend on the database."""
    keys = bootstrap(sqlite_settings)
    with TestClient(create_app(sqlite_settings)) as client:
        yield client, keys, sqlite_settings


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_submit_then_status_shows_queued(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    r = client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth(keys["alice"]))
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "queued" and body["queue_position"] == 1
    assert r.headers["location"] == body["status_url"] == f"/v1/submissions/{body['id']}"
    r2 = client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth(keys["alice"]))
    assert r2.json()["queue_position"] == 2
    s = client.get(body["status_url"], headers=auth(keys["alice"])).json()
    assert s["status"] == "queued" and s["stages"] == [] and s["seed"] is None and s["submitter"] == "alice"
    # another submitter cannot read it; the admin can
    assert client.get(body["status_url"], headers=auth(keys["bob"])).status_code == 404
    assert client.get(body["status_url"], headers=auth(keys["admin"])).status_code == 200


def test_api_keys_are_required_and_stored_hashed(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _settings = api
    assert client.post("/v1/submissions", json=example("pytorch_fp32")).status_code == 401
    assert client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth("ka_nope")).status_code == 401
    with client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
        stored = [k.key_hash for k in s.scalars(select(ApiKey))]
    assert keys["alice"] not in json.dumps(stored) and all(len(h) == 64 for h in stored)
    # X-API-Key works too
    assert (
        client.post("/v1/submissions", json=example("pytorch_fp32"), headers={"X-API-Key": keys["alice"]}).status_code
        == 202
    )


def test_invalid_solution_names_field_and_reason(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    bad = example("pytorch_fp32")
    bad["spec"]["entry_point"] = "kernel.py"
    r = client.post("/v1/submissions", json=bad, headers=auth(keys["alice"]))
    assert r.status_code == 422
    errs = r.json()["errors"]
    assert any(e["field"] == "spec.entry_point" and "file.py::function" in e["reason"] for e in errs), errs
    missing = example("pytorch_fp32")
    del missing["sources"]
    errs = client.post("/v1/submissions", json=missing, headers=auth(keys["alice"])).json()["errors"]
    assert {"field": "sources", "reason": "Field required"} in errs
    r = client.post(
        "/v1/submissions", content=b"{not json", headers={**auth(keys["alice"]), "content-type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "(body)"


def test_unknown_definition_is_404(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    sol = example("pytorch_fp32")
    sol["definition"] = "no_such_op"
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 404 and "no_such_op" in r.json()["detail"] and "embedding_backward" in r.json()["detail"]


def test_body_over_1_mib_is_413(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    sol = example("pytorch_fp32")
    sol["description"] = "x" * (1024 * 1024)
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 413

    # without a Content-Length (chunked), still 413
    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"x" * 65536

    r = client.post(
        "/v1/submissions", content=chunks(), headers={**auth(keys["alice"]), "content-type": "application/json"}
    )
    assert r.status_code == 413


def test_multipart_py_upload(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    src = example("pytorch_fp32")["sources"][0]["content"].encode()
    r = client.post(
        "/v1/submissions",
        files={"file": ("my_kernel.py", src, "text/x-python")},
        data={"definition": "embedding_backward"},
        headers=auth(keys["alice"]),
    )
    assert r.status_code == 202, r.text
    s = client.get(r.json()["status_url"], headers=auth(keys["alice"])).json()
    assert s["solution_name"] == "my_kernel" and s["problem"] == "embedding_backward"
    r = client.post(
        "/v1/submissions",
        files={"file": ("k.py", src, "text/x-python")},
        data={"definition": "nope"},
        headers=auth(keys["alice"]),
    )
    assert r.status_code == 404
    r = client.post(
        "/v1/submissions",
        files={"file": ("k.txt", src, "text/plain")},
        data={"definition": "embedding_backward"},
        headers=auth(keys["alice"]),
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "file"


def test_idempotency_key(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    h = {**auth(keys["alice"]), "Idempotency-Key": "abc-123"}
    first = client.post("/v1/submissions", json=example("pytorch_fp32"), headers=h)
    again = client.post("/v1/submissions", json=example("pytorch_fp32"), headers=h)
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.json()["idempotent_replay"] is True
    other = example("pytorch_fp32")
    other["name"] = "something_else"
    assert client.post("/v1/submissions", json=other, headers=h).status_code == 409
    # the same key from another submitter is a different submission
    bob = client.post(
        "/v1/submissions", json=example("pytorch_fp32"), headers={**auth(keys["bob"]), "Idempotency-Key": "abc-123"}
    )
    assert bob.status_code == 202 and bob.json()["id"] != first.json()["id"]
    with client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
        assert s.scalar(select(func.count()).select_from(Submission)) == 2


def test_rate_limit_429_with_retry_after(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    with client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
        _, key = create_api_key(s, "carol", ("submit",), "3/minute")
        s.commit()
    codes = [client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth(key)) for _ in range(5)]
    assert [c.status_code for c in codes] == [202, 202, 202, 429, 429]
    assert 1 <= int(codes[3].headers["retry-after"]) <= 60


def test_problems_and_leaderboard_endpoints(api) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = api
    ps = client.get("/v1/problems").json()
    from worker.catalogue import load_catalogue

    catalogue = load_catalogue()
    assert [p["name"] for p in ps] == sorted(catalogue.problems)
    assert {p["name"]: p["content_hash"] for p in ps} == {p.name: p.content_hash for p in catalogue}
    d = client.get("/v1/problems/embedding_backward").json()
    assert d["definition"]["name"] == "embedding_backward" and "indices" in d["inputs"]
    assert client.get("/v1/problems/nope").status_code == 404
    assert client.get("/v1/leaderboard/embedding_backward").json() == {"problem": "embedding_backward", "rows": []}
    assert client.get("/v1/leaderboard/nope").status_code == 404


def test_reaudit_is_admin_only_and_makes_a_new_attempt(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    sid = client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth(keys["alice"])).json()["id"]
    assert client.post(f"/v1/submissions/{sid}/reaudit", headers=auth(keys["alice"])).status_code == 403
    r = client.post(f"/v1/submissions/{sid}/reaudit", headers=auth(keys["admin"]))
    assert r.status_code == 202 and r.json()["id"] == sid
    s = client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"])).json()
    assert s["attempt"] == 2 and s["reason"] == "re-audit requested"
    with client.app.state.services.sessions() as sess:  # type: ignore[attr-defined]
        seeds = list(sess.scalars(select(Audit.seed).where(Audit.submission_id == sid)))
    assert len(seeds) == 2 and seeds[0] != seeds[1]


def test_submissions_are_routed_by_target_hardware(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, settings = api
    gpu_only = example("triton_bf16_atomic")
    assert gpu_only["spec"]["target_hardware"] == ["B200"]
    # a CPU-only deployment refuses a GPU-only kernel up front, naming the field, and stores nothing
    r = client.post("/v1/submissions", json=gpu_only, headers=auth(keys["alice"]))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "spec.target_hardware" and "audits on cpu only" in err["reason"]
    with client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
        assert s.scalar(select(func.count()).select_from(Submission)) == 0
    # a deployment with GPU workers queues it for them; a portable kernel goes there too
    both = settings.model_copy(update={"audit_devices": "cpu,cuda"})
    try:
        with TestClient(create_app(both)) as gpu_client:
            sid = gpu_client.post("/v1/submissions", json=gpu_only, headers=auth(keys["alice"])).json()["id"]
            portable = gpu_client.post(
                "/v1/submissions", json=example("triton_fp32"), headers=auth(keys["alice"])
            ).json()["id"]
            assert gpu_client.post(f"/v1/submissions/{sid}/reaudit", headers=auth(keys["admin"])).status_code == 202
            with gpu_client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
                routed = {(a.submission_id, a.attempt): (a.device, a.queue) for a in s.scalars(select(Audit))}
    finally:
        if not settings.is_sqlite:
            drop_queue(both.queue_for("cuda"))
    gpu = ("cuda", settings.queue_prefix + "gpu")
    assert routed == {(sid, 1): gpu, (sid, 2): gpu, (portable, 1): gpu}  # the re-audit keeps the routed device


def test_admin_creates_keys(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    assert client.post("/v1/api-keys", json={"submitter": "dave"}, headers=auth(keys["alice"])).status_code == 403
    r = client.post("/v1/api-keys", json={"submitter": "dave", "scopes": ["submit"]}, headers=auth(keys["admin"]))
    assert r.status_code == 201
    assert (
        client.post("/v1/submissions", json=example("pytorch_fp32"), headers=auth(r.json()["key"])).status_code == 202
    )
