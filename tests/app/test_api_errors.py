"""Hostile and malformed requests: never a 500, every 4xx in the one documented shape, bounded answers,
and the checks that need no sandbox answered at POST time."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select
import test_api
from svc_support import example
from test_api import auth

from app.models import Submission
from worker.formats.json_bounds import MAX_JSON_DEPTH, JsonTooDeep, json_depth, loads_bounded, walk_strings

# the API fixtures of test_api.py (sqlite_api: SQLite only; api: SQLite and Postgres)
api = test_api.api
sqlite_api = test_api.sqlite_api


def _shape(r) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    """The documented 4xx shape: {detail: str, errors: [{field, reason}]} and nothing else."""
    body = r.json()
    assert set(body) == {"detail", "errors"}, body
    assert isinstance(body["detail"], str) and body["detail"]
    assert all(set(e) == {"field", "reason"} and all(isinstance(v, str) for v in e.values()) for e in body["errors"]), (
        body
    )
    assert not any(e["reason"].startswith(("Value error, ", "Assertion failed, ")) for e in body["errors"]), body
    return body["errors"]


def _stored(client) -> int:  # type: ignore[no-untyped-def]
    with client.app.state.services.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(Submission)))


def test_json_depth_is_measured_without_recursion() -> None:
    assert json_depth('[1, {"a": [2, "]]]"]}, "\\"["]') == 3
    assert json_depth('"[[[" ' * 3) == 0
    deep = "[" * 200_000 + "]" * 200_000
    assert json_depth(deep) == 200_000  # json.loads would raise RecursionError here
    with pytest.raises(JsonTooDeep):
        loads_bounded(deep)
    assert loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    nested: list = []
    for _ in range(100_000):
        nested = [nested, "x\x00" if not nested else "y"]
    assert sum("\x00" in s for s in walk_strings(nested)) == 1


@pytest.mark.parametrize("depth", [450, 5_000, 100_000])
def test_deeply_nested_json_is_422_not_500(sqlite_api, depth: int) -> None:  # type: ignore[no-untyped-def]
    """~400 levels made the recursive NUL check (and json.loads beyond ~1000) raise RecursionError: HTTP 500."""
    client, keys, _ = sqlite_api
    sol = json.dumps(example("pytorch_fp32"))
    body = sol[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"
    for path in ("/v1/submissions", "/v1/api-keys"):  # the submission parser and FastAPI's own body parsing
        r = client.post(
            path, content=body.encode(), headers={**auth(keys["admin"]), "content-type": "application/json"}
        )
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        errs = _shape(r)
        assert errs[0]["field"] == "(body)" and f"at most {MAX_JSON_DEPTH}" in errs[0]["reason"]
    assert _stored(client) == 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (b'"x": 1' + b"0" * 5000, "not valid JSON"),  # json.loads raises a plain ValueError (over 4300 digits)
        (b'"x": "\\ud800"', "lone surrogates"),  # decodes to a str Postgres cannot store as UTF-8
        (b'"x": "\xff\xfe"', "not valid JSON"),  # not UTF-8
        (b'"x": "a\\u0000b"', "NUL"),
    ],
)
def test_unstorable_json_is_422_not_500(api, extra: bytes, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = api
    body = json.dumps(example("pytorch_fp32")).encode()[:-1] + b", " + extra + b"}"
    r = client.post(
        "/v1/submissions", content=body, headers={**auth(keys["alice"]), "content-type": "application/json"}
    )
    assert r.status_code == 422, r.text[:300]
    errs = _shape(r)
    assert errs[0]["field"] == "(body)" and needle in errs[0]["reason"], errs
    assert _stored(client) == 0


def test_bad_headers_and_bodies_use_the_documented_shape(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    client, keys, _ = sqlite_api
    r = client.post(
        "/v1/submissions", json=example("pytorch_fp32"), headers={**auth(keys["alice"]), "Idempotency-Key": "x" * 300}
    )
    assert r.status_code == 422
    assert [e["field"] for e in _shape(r)] == ["Idempotency-Key"]
    r = client.post(
        "/v1/api-keys", json={"submitter": "", "scopes": ["root"], "rate_limit": "lots"}, headers=auth(keys["admin"])
    )
    assert r.status_code == 422
    fields = {e["field"] for e in _shape(r)}
    assert {"submitter", "scopes.0", "rate_limit"} <= fields, fields
    r = client.post(
        "/v1/api-keys", content=b"{nope", headers={**auth(keys["admin"]), "content-type": "application/json"}
    )
    assert r.status_code == 422 and _shape(r)[0]["field"] == "(body)"
    # a validator's own words come through without pydantic's "Value error, " prefix
    bad = example("pytorch_fp32")
    bad["sources"][0]["path"] = "../escape.py"
    r = client.post("/v1/submissions", json=bad, headers=auth(keys["alice"]))
    assert r.status_code == 422
    assert {
        "field": "sources.0.path",
        "reason": "must be a relative path inside the solution: it has a '..' part: a source must "
        "stay inside the solution folder",
    } in _shape(r)
    # HTTPException answers too: 401, 403, 404, 405, 413, 415
    assert client.post("/v1/submissions", json=example("pytorch_fp32")).status_code == 401
    _shape(client.post("/v1/submissions", json=example("pytorch_fp32")))
    r = client.post("/v1/api-keys", json={"submitter": "x"}, headers=auth(keys["alice"]))
    assert r.status_code == 403 and _shape(r) == []
    r = client.get("/v1/submissions/" + "f" * 32, headers=auth(keys["alice"]))
    assert r.status_code == 404 and _shape(r) == []
    assert client.put("/v1/submissions", headers=auth(keys["alice"])).status_code == 405
    _shape(client.put("/v1/submissions", headers=auth(keys["alice"])))
    r = client.post(
        "/v1/submissions",
        content=b"x" * (2 * 1024 * 1024),
        headers={**auth(keys["alice"]), "content-type": "text/plain"},
    )
    assert r.status_code == 413 and _shape(r)[0]["field"] == "(body)"
    r = client.post("/v1/submissions", content=b"x", headers={**auth(keys["alice"]), "content-type": "text/plain"})
    assert r.status_code == 415 and _shape(r)[0]["field"] == "content-type"
    sol = example("pytorch_fp32")
    sol["definition"] = "no_such_op"
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 404 and _shape(r)[0]["field"] == "definition"
    # and the OpenAPI document says so: every 422 refers to this shape
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert set(schemas["HTTPValidationError"]["properties"]) == {"detail", "errors"} and "FieldError" in schemas


def test_wrong_entry_point_answer_is_brief(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    """A solution with thousands of sources and an entry file among none of them: the answer does not list them all."""
    client, keys, _ = sqlite_api
    sol = example("pytorch_fp32")
    sol["spec"]["entry_point"] = "missing.py::run"
    sol["sources"] += [{"path": f"pkg/{'d' * 150}_{i}.py", "content": ""} for i in range(5000)]
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 422
    assert len(r.content) < 2000, len(r.content)
    errs = _shape(r)
    assert errs[0]["field"] == "spec.entry_point" and "'missing.py' is not among sources" in errs[0]["reason"]
    assert "and 4996 more" in errs[0]["reason"]  # 5001 sources, 5 named
    # many invalid fields: at most 20 listed, and a note of how many more
    sol = example("pytorch_fp32")
    sol["sources"] = [{"path": f"/abs{i}.py", "content": ""} for i in range(100)]
    errs = _shape(client.post("/v1/submissions", json=sol, headers=auth(keys["alice"])))
    assert len(errs) == 21 and errs[-1]["reason"] == "80 more errors not shown"


@pytest.mark.parametrize(
    ("source", "field", "needle"),
    [
        ("def run(a, b:\n    pass\n", "sources.0.content", "syntax error"),
        ("def forward(indices, grad_output, out):\n    pass\n", "spec.entry_point", "entry point 'run' is not defined"),
        ("def run(indices):\n    pass\n", "spec.entry_point", "takes 1 positional arguments"),
        ("x = (" * 300 + ")" * 300 + "\ndef run(*a):\n    pass\n", "sources.0.content", "kernel.py"),
    ],
)
def test_cheap_checks_are_answered_at_post(sqlite_api, source: str, field: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    """Syntax, entry point and arity come back at once as 422 (they came back after the queue), and nothing is stored."""
    client, keys, _ = sqlite_api
    sol = example("pytorch_fp32")
    sol["sources"][0]["content"] = source
    sol["spec"]["entry_point"] = f"{sol['sources'][0]['path']}::run"
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 422, r.text
    errs = _shape(r)
    assert errs[0]["field"] == field and needle in errs[0]["reason"], errs
    # the .py upload gets the same checks
    r = client.post(
        "/v1/submissions",
        files={"file": ("mine.py", source.encode(), "text/x-python")},
        data={"definition": "embedding_backward"},
        headers=auth(keys["alice"]),
    )
    assert r.status_code == 422 and needle.replace("kernel.py", "mine.py") in _shape(r)[0]["reason"]
    assert _stored(client) == 0


def test_public_read_is_a_setting(sqlite_settings) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient
    from svc_support import bootstrap

    from app.main import create_app

    keys = bootstrap(sqlite_settings)
    paths = ("/v1/problems", "/v1/problems/embedding_backward", "/v1/leaderboard/embedding_backward")
    with TestClient(create_app(sqlite_settings)) as public:
        assert sqlite_settings.public_read is True
        assert [public.get(p).status_code for p in paths] == [200, 200, 200]
    private = sqlite_settings.model_copy(update={"public_read": False})
    with TestClient(create_app(private)) as client:
        for p in paths:
            r = client.get(p)
            assert r.status_code == 401 and _shape(r) == [] and "API key" in r.json()["detail"]
            assert client.get(p, headers=auth("ka_wrong")).status_code == 401
            assert client.get(p, headers=auth(keys["bob"])).status_code == 200
