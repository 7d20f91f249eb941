"""POST /v1/definitions answers what the database cannot store (a name past the address's length, a NUL or a lone
surrogate) with a 422 in the JSON error shape, naming the field and what to do; it was a plain-text 500 (real
Postgres, the API in process)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from svc_support import bootstrap

from app.core.settings import Settings
from app.main import create_app

pytestmark = [pytest.mark.services]

DEFINITION: dict[str, Any] = {
    "name": "row_scale_sum",
    "description": "Sum of each row of x times a scalar, in fp32.",
    "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
    "inputs": {"x": {"shape": ["rows", "cols"], "dtype": "float32"}, "scale": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["rows"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, scale):\n    return (x.float() * scale).sum(-1)\n",
}
WORKLOADS = [
    {
        "uuid": "w-64-96",
        "axes": {"rows": 64, "cols": 96},
        "inputs": {"x": {"type": "random"}, "scale": {"type": "scalar", "value": 0.5}},
    }
]


@pytest.fixture
def api(service_settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    keys = bootstrap(service_settings)
    with TestClient(create_app(service_settings), raise_server_exceptions=False) as client:
        yield client, {k: f"Bearer {v}" for k, v in keys.items()}


def _bundle(**definition: object) -> dict[str, Any]:
    d = copy.deepcopy(DEFINITION)
    d.update(definition)
    return {"definition": d, "workloads": WORKLOADS}


def _post(client: TestClient, key: str, bundle: dict[str, Any], path: str = "/v1/definitions"):  # type: ignore[no-untyped-def]
    # ensure_ascii: a lone surrogate travels as the JSON escape "\ud800", as a client's JSON would carry it
    return client.post(
        path,
        content=json.dumps(bundle, ensure_ascii=True),
        headers={"Authorization": key, "content-type": "application/json"},
    )


def _the_one_error(r) -> dict[str, str]:  # type: ignore[no-untyped-def]
    assert r.status_code == 422, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"detail", "errors"} and len(body["errors"]) == 1, body
    return body["errors"][0]


def test_unstorable_definitions_are_422_with_the_field_and_what_to_do(api) -> None:  # type: ignore[no-untyped-def]
    client, keys = api
    err = _the_one_error(_post(client, keys["alice"], _bundle(name="n" * 201)))
    assert err["field"] == "definition.name" and "201 characters" in err["reason"] and "at most 187" in err["reason"]
    err = _the_one_error(_post(client, keys["alice"], _bundle(name="n" * 188)))  # its address would pass 200
    assert err["field"] == "definition.name" and "shorten it" in err["reason"]

    err = _the_one_error(_post(client, keys["alice"], _bundle(description="fused\x00sum")))
    assert err["field"] == "definition.description" and "NUL" in err["reason"] and "remove it" in err["reason"]
    err = _the_one_error(_post(client, keys["alice"], _bundle(description="half a pair: \ud800")))
    assert err["field"] == "definition.description" and "surrogate" in err["reason"]
    err = _the_one_error(
        _post(client, keys["alice"], {"definition": DEFINITION, "workloads": [{**WORKLOADS[0], "uuid": "w\x00"}]})
    )
    assert err["field"] == "workloads.0.uuid" and "NUL" in err["reason"]

    # the same checks when the definition comes with a solution
    sol = {
        "name": "k",
        "definition": DEFINITION["name"],
        "author": "alice",
        "spec": {
            "language": "python",
            "target_hardware": ["cpu"],
            "entry_point": "k.py::run",
            "destination_passing_style": False,
        },
        "sources": [{"path": "k.py", "content": "def run(x, scale):\n    return (x * scale).sum(-1)\n"}],
    }
    r = _post(client, keys["alice"], {"solution": sol, **_bundle(description="x\ud800")}, "/v1/submissions")
    assert r.status_code == 422 and r.json()["errors"], r.text

    # the longest name that fits is stored, at an address of exactly 200 characters
    ok = _post(client, keys["alice"], _bundle(name="n" * 187))
    assert ok.status_code == 201, ok.text
    assert len(ok.json()["name"]) == 200
    listed = {p["name"] for p in client.get("/v1/problems", headers={"Authorization": keys["alice"]}).json()}
    assert listed & {ok.json()["name"]} and not any(
        n.startswith("row_scale_sum") for n in listed
    )  # nothing else stored
