"""The submission resources: listing (own, paginated, filtered), every attempt kept after a re-audit, progress
while running, seeds as strings; API keys listed and revoked at once."""

from __future__ import annotations

import json

import test_api
from svc_support import example
from test_api import auth

from app.audits import repository as audits
from app.submissions.views import MAX_SAFE_INT
from worker.report import stage_order

# the API fixtures of test_api.py (sqlite_api: SQLite only; api: SQLite and Postgres)
api = test_api.api


def _submit(client, key: str, name: str = "k") -> str:  # type: ignore[no-untyped-def]
    sol = example("pytorch_fp32")
    sol["name"] = name
    r = client.post("/v1/submissions", json=sol, headers=auth(key))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _run_stages(client, audit_id: str, stages: list[tuple[str, dict]], finish: str | None = None) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Do what the audit task does, through the same repository calls: claim, store each stage, finish."""
    with client.app.state.services.sessions.begin() as s:
        assert audits.claim(s, audit_id, "test-worker", 60) is not None
    for name, evidence in stages:
        with client.app.state.services.sessions.begin() as s:
            assert audits.store_stage(
                s,
                audit_id,
                "test-worker",
                name=name,
                position=stage_order().index(name),
                status="passed",
                summary=f"{name} ok",
                metrics={"n": 1},
                evidence=evidence,
                duration_s=0.5,
                lease_s=60,
            )
    if finish:
        with client.app.state.services.sessions.begin() as s:
            assert audits.finish(s, audit_id, "test-worker", finish, "pass" if finish == "passed" else "fail", "done")


def test_stage_order_is_the_engines() -> None:
    from worker.engine import stage_runs

    assert stage_order() == (*stage_runs(), "verdict")


def test_list_own_submissions_paginated_and_filtered(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    mine = [_submit(client, keys["alice"], f"a{i}") for i in range(5)]
    theirs = _submit(client, keys["bob"], "b0")
    r = client.get("/v1/submissions?limit=2", headers=auth(keys["alice"]))
    assert r.status_code == 200, r.text
    seen, page = [], r.json()
    while True:
        seen += [i["id"] for i in page["items"]]
        assert len(page["items"]) <= 2 and all(i["submitter"] == "alice" for i in page["items"])
        if page["next_cursor"] is None:
            break
        page = client.get(
            "/v1/submissions", params={"limit": 2, "cursor": page["next_cursor"]}, headers=auth(keys["alice"])
        ).json()
    assert seen == list(reversed(mine))  # newest first, each once, never bob's
    everyone = client.get("/v1/submissions?limit=100", headers=auth(keys["admin"])).json()["items"]
    assert {i["id"] for i in everyone} == {*mine, theirs}
    # filters: the latest audit's status, and the problem
    audit_id = client.get(f"/v1/submissions/{mine[0]}", headers=auth(keys["alice"])).json()["audit_id"]
    _run_stages(client, audit_id, [("intake", {})], finish="failed")
    failed = client.get("/v1/submissions?status=failed", headers=auth(keys["alice"])).json()["items"]
    assert [(i["id"], i["status"], i["verdict"]) for i in failed] == [(mine[0], "failed", "fail")]
    assert len(client.get("/v1/submissions?status=queued", headers=auth(keys["alice"])).json()["items"]) == 4
    assert client.get("/v1/submissions?problem=rmsnorm_forward", headers=auth(keys["alice"])).json()["items"] == []
    assert (
        len(client.get("/v1/submissions?problem=embedding_backward", headers=auth(keys["alice"])).json()["items"]) == 5
    )
    # bad parameters are 422 with the field
    for query, field in (
        ("status=finished", "status"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("cursor=%25%25", "cursor"),
        ("cursor=" + "QUFB", "cursor"),
    ):
        r = client.get("/v1/submissions?" + query, headers=auth(keys["alice"]))
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, (query, r.text)
    assert client.get("/v1/submissions").status_code == 401


def test_attempts_keep_the_previous_result_and_seeds_are_strings(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    sid = _submit(client, keys["alice"])
    first = client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"])).json()
    big = 2**61 + 12345  # a 62-bit seed in the evidence, as the probes store "seeds to reproduce"
    _run_stages(client, first["audit_id"], [("intake", {"seeds": [big, 7]}), ("static", {})], finish="passed")
    assert client.post(f"/v1/submissions/{sid}/reaudit", headers=auth(keys["admin"])).status_code == 202
    r = client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"]))
    s = r.json()
    assert s["attempt"] == 2 and s["status"] == "queued" and s["seed"] is None and s["stages"] == []
    assert [a["attempt"] for a in s["attempts"]] == [1, 2]
    old = s["attempts"][0]
    assert (
        old["status"] == "passed"
        and old["verdict"] == "pass"
        and [st["name"] for st in old["stages"]] == ["intake", "static"]
    )
    assert isinstance(old["seed"], str) and int(old["seed"]) > 0
    assert old["stages"][0]["evidence"]["seeds"] == [str(big), 7]
    # read as JSON by a client with doubles only (JavaScript, jq), every integer survives
    doubles = json.loads(r.text, parse_int=float)
    assert doubles["attempts"][0]["stages"][0]["evidence"]["seeds"][0] == str(big)
    assert all(abs(v) <= MAX_SAFE_INT for v in _ints(s))


def _ints(value):  # type: ignore[no-untyped-def]
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [i for v in value.values() for i in _ints(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ints(v)]
    return []


def test_progress_while_running(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    sid = _submit(client, keys["alice"])
    audit_id = client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"])).json()["audit_id"]
    assert client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"])).json()["progress"] is None  # queued
    _run_stages(client, audit_id, [("intake", {}), ("static", {})])
    s = client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"])).json()
    p = s["progress"]
    assert s["status"] == "running" and p["current_stage"] == "benchmark"
    assert p["stages_done"] == 2 and p["stages_total"] == len(stage_order())
    assert 0 <= p["current_stage_elapsed_s"] <= p["elapsed_s"]
    assert [(st["name"], st["duration_s"]) for st in s["stages"]] == [("intake", 0.5), ("static", 0.5)]
    with client.app.state.services.sessions.begin() as sess:
        assert audits.finish(sess, audit_id, "test-worker", "passed", "pass", "done")
    assert client.get(f"/v1/submissions/{sid}", headers=auth(keys["alice"])).json()["progress"] is None


def test_api_keys_listed_and_revoked_at_once(api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    made = client.post("/v1/api-keys", json={"submitter": "alice"}, headers=auth(keys["admin"])).json()
    listed = client.get("/v1/api-keys", headers=auth(keys["alice"])).json()
    assert {k["submitter"] for k in listed} == {"alice"} and made["id"] in {k["id"] for k in listed}
    assert all("key" not in k and "key_hash" not in k and len(k["prefix"]) < 16 for k in listed)
    assert {k["submitter"] for k in client.get("/v1/api-keys", headers=auth(keys["admin"])).json()} == {
        "admin",
        "alice",
        "bob",
    }
    # the new key works; it is cached now, and revocation still takes effect on the very next request
    assert client.get("/v1/submissions", headers=auth(made["key"])).status_code == 200
    bob_keys = [k for k in client.get("/v1/api-keys", headers=auth(keys["bob"])).json()]
    assert (
        client.delete(f"/v1/api-keys/{bob_keys[0]['id']}", headers=auth(keys["alice"])).status_code == 404
    )  # not hers
    r = client.delete(f"/v1/api-keys/{made['id']}", headers=auth(keys["alice"]))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert client.get("/v1/submissions", headers=auth(made["key"])).status_code == 401
    assert client.delete(f"/v1/api-keys/{made['id']}", headers=auth(keys["admin"])).status_code == 200  # idempotent
    assert client.delete("/v1/api-keys/nope", headers=auth(keys["admin"])).status_code == 422
    assert client.delete("/v1/api-keys/" + "0" * 32, headers=auth(keys["admin"])).status_code == 404
    # an admin revokes anyone's key, at once
    assert client.get("/v1/submissions", headers=auth(keys["bob"])).status_code == 200
    assert client.delete(f"/v1/api-keys/{bob_keys[0]['id']}", headers=auth(keys["admin"])).status_code == 200
    assert client.get("/v1/submissions", headers=auth(keys["bob"])).status_code == 401
