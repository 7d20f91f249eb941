"""Webhooks end to end: the API (in process), Postgres, Redis, a real Celery worker consuming the audit and webhook
queues, and a real HTTP receiver on 127.0.0.1 (allowlisted). Every wait is on an event: a request arriving, or a row
reaching a state."""

from __future__ import annotations

import sys
import uuid
from datetime import datetime
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from standardwebhooks import Webhook
from svc_support import (
    REDIS_URL,
    Proc,
    bootstrap,
    create_pg_database,
    drop_pg_database,
    drop_queue,
    env_for,
    example,
    postgres_reachable,
    redis_reachable,
    wait_for,
)
from webhook_receiver import Receiver

from app.audits.queue import AuditQueue
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.jobs.celery import make_celery
from app.main import create_app
from app.models import WebhookDelivery
from app.webhooks.dispatch import dispatch_due

pytestmark = [pytest.mark.services, pytest.mark.slow]


class World:
    def __init__(self, settings: Settings, keys: dict[str, str], client: TestClient, worker: Proc) -> None:
        self.settings, self.keys, self.client, self.worker = settings, keys, client, worker
        self.sessions = make_sessionmaker(make_engine(settings))

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def register(self, who: str, url: str, events: list[str]) -> dict:  # type: ignore[type-arg]
        r = self.client.post("/v1/webhooks", json={"url": url, "events": events}, headers=self.h(who))
        assert r.status_code == 201, r.text
        return r.json()

    def submit(self, who: str, solution: dict | None = None) -> dict:  # type: ignore[type-arg]
        sol = solution or example("pytorch_fp32")
        sol["name"] = f"{sol['name']}_{uuid.uuid4().hex[:6]}"
        r = self.client.post("/v1/submissions", json=sol, headers=self.h(who))
        assert r.status_code == 202, r.text
        return r.json()

    def log(self, endpoint_id: str, who: str) -> list[dict]:  # type: ignore[type-arg]
        """The whole delivery log, newest attempt first (one page of up to 100)."""
        r = self.client.get(f"/v1/webhooks/{endpoint_id}/deliveries?limit=100", headers=self.h(who))
        assert r.status_code == 200, r.text
        assert r.json()["next_cursor"] is None
        return r.json()["items"]  # type: ignore[no-any-return]

    def deliveries(self, endpoint_id: str) -> list[WebhookDelivery]:
        with self.sessions() as s:
            return list(s.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    why = postgres_reachable() or redis_reachable()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("webhooks")
    url = create_pg_database()
    settings = Settings(
        database_url=url,
        redis_url=REDIS_URL,
        queue_prefix=f"t{uuid.uuid4().hex[:8]}_",
        audit_stages="intake",
        lease_s=4,
        heartbeat_s=0.5,
        requeue_after_s=3,
        reaper_interval_s=0.5,
        broker_dir=tmp / "broker",
        webhook_timeout_s=2.0,
        webhook_backoff_base_s=0.05,
        webhook_backoff_max_s=0.2,
        webhook_disable_after=3,
        webhook_max_attempts=10,
        webhook_sweep_interval_s=0.1,
        webhook_allowlist="127.0.0.1/32",
    )
    keys = bootstrap(settings)
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "app.jobs.worker",
        "worker",
        "-Q",
        f"{settings.audit_queue},{settings.webhook_queue}",
        "--concurrency",
        "1",
        "--pool",
        "prefork",
        "-n",
        f"hooks-{uuid.uuid4().hex[:6]}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    worker = Proc(argv, env_for(settings), tmp / "worker.log")
    app = create_app(settings)
    try:
        with TestClient(app) as client:
            w = World(settings, keys, client, worker)
            yield w
            w.sessions.kw["bind"].dispose()
    finally:
        worker.stop()
        for q in (settings.audit_queue, settings.webhook_queue):
            drop_queue(q)
        drop_pg_database(url)


def _all_delivered(world: World, endpoint_id: str) -> bool:
    rows = world.deliveries(endpoint_id)
    return bool(rows) and all(r.status == "delivered" for r in rows)


def test_signed_events_of_an_audit_and_one_audit_completed_when_the_task_runs_twice(world: World) -> None:
    with Receiver() as rx:
        ep = world.register(
            "alice", rx.url, ["submission.received", "audit.stage_completed", "audit.completed", "submission.reaudited"]
        )
        assert ep["secret"].startswith("whsec_")
        listed = world.client.get("/v1/webhooks", headers=world.h("alice")).json()
        assert [e["id"] for e in listed] == [ep["id"]] and "secret" not in listed[0]  # shown once
        assert world.client.get("/v1/webhooks", headers=world.h("bob")).json() == []

        broken = example("pytorch_fp32")
        broken["sources"][0]["content"] = "1 / 0  # fails on import, in the sandbox\n" + broken["sources"][0]["content"]
        sub = world.submit("alice", broken)
        audit_id = sub["audit_id"]

        def completed(r) -> bool:  # type: ignore[no-untyped-def]
            return r.json["type"] == "audit.completed" and r.json["data"]["audit_id"] == audit_id

        (done,) = rx.received(1, 180, completed)
        assert done.json["data"]["verdict"] == "fail" and done.json["data"]["caught_by"] == "intake"
        # the same audit task delivered twice more, then a re-audit: the worker takes them in order (one queue,
        # concurrency 1), so once the re-audit's audit.completed arrives the duplicates have been handled
        queue = AuditQueue(make_celery(world.settings))
        assert queue.send(audit_id, world.settings.audit_queue) and queue.send(audit_id, world.settings.audit_queue)
        again = world.client.post(f"/v1/submissions/{sub['id']}/reaudit", headers=world.h("admin"))
        assert again.status_code == 202, again.text
        second = again.json()["audit_id"]
        rx.received(1, 180, lambda r: r.json["type"] == "audit.completed" and r.json["data"]["audit_id"] == second)
        wait_for(lambda: _all_delivered(world, ep["id"]), 60, "deliveries still pending", world.worker)

        wh = Webhook(ep["secret"])
        for req in rx.requests:
            assert wh.verify(req.body, req.headers) == req.json  # every request signed, per Standard Webhooks
        ids = {req.headers["webhook-id"] for req in rx.requests if completed(req)}
        assert len(ids) == 1  # exactly one audit.completed for the audit
        events = {
            r.headers["webhook-id"]: r.json["type"] for r in rx.requests if r.json["data"].get("audit_id") == audit_id
        }
        types = sorted(events.values())
        assert types.count("submission.received") == 1 and types.count("audit.stage_completed") == 6
        assert any(
            r.json["type"] == "submission.reaudited" and r.json["data"]["audit_id"] == second for r in rx.requests
        )

        log = world.log(ep["id"], "alice")
        assert len(log) == len(rx.requests)  # one logged attempt per request received
        assert {a["event_id"] for a in log} == {r.headers["webhook-id"] for r in rx.requests}
        assert all(
            a["outcome"] == a["delivery_status"] == "delivered" and a["retry_at"] is None and a["latency_ms"] > 0
            for a in log
        )
        assert world.client.get(f"/v1/webhooks/{ep['id']}/deliveries", headers=world.h("bob")).status_code == 404
        assert world.client.delete(f"/v1/webhooks/{ep['id']}", headers=world.h("bob")).status_code == 404
        assert world.client.delete(f"/v1/webhooks/{ep['id']}", headers=world.h("alice")).status_code == 204
        assert world.client.get(f"/v1/webhooks/{ep['id']}", headers=world.h("alice")).status_code == 404
        assert world.deliveries(ep["id"]) == []


def test_retries_after_a_500_and_a_timeout_then_delivers(world: World) -> None:
    with Receiver(script=[500, "hang", 200]) as rx:
        ep = world.register("bob", rx.url, ["submission.received"])
        world.submit("bob")
        first, second, third = rx.received(3, 120)
        assert first.headers["webhook-id"] == second.headers["webhook-id"] == third.headers["webhook-id"]
        wh = Webhook(ep["secret"])
        for req in (first, second, third):
            assert wh.verify(req.body, req.headers)["type"] == "submission.received"
        wait_for(lambda: _all_delivered(world, ep["id"]), 60, "not marked delivered", world.worker)
        log = world.log(ep["id"], "bob")
        assert [(a["attempt"], a["status_code"]) for a in log] == [(3, 200), (2, None), (1, 500)]  # newest first
        assert [a["outcome"] for a in log] == ["delivered", "failed", "failed"]
        assert "timeout" in log[1]["error"] and log[1]["latency_ms"] >= 2000 * 0.9
        assert log[2]["error"] == "HTTP 500"
        assert world.client.get(f"/v1/webhooks/{ep['id']}", headers=world.h("bob")).json()["consecutive_failures"] == 0
        assert world.client.delete(f"/v1/webhooks/{ep['id']}", headers=world.h("bob")).status_code == 204


def test_a_500_is_logged_failed_and_retried_as_the_backoff_says_and_the_log_pages(world: World) -> None:
    """Before, the log showed each attempt with its delivery's latest status: an attempt answered 500 read
    `delivered` once a retry got through. And it was a bare list, where other lists page."""
    with Receiver(script=[500, 503]) as rx:
        ep = world.register("bob", rx.url, ["submission.received"])
        world.submit("bob")
        rx.received(3, 120)
        wait_for(lambda: _all_delivered(world, ep["id"]), 60, "not marked delivered", world.worker)
        url = f"/v1/webhooks/{ep['id']}/deliveries"
        pages, cursor = [], None
        while True:  # a page of one attempt at a time, by the cursor each page gives
            r = world.client.get(
                url, params={"limit": 1, **({"cursor": cursor} if cursor else {})}, headers=world.h("bob")
            )
            assert r.status_code == 200, r.text
            pages.append(r.json()["items"])
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
        assert [len(p) for p in pages] == [1, 1, 1]
        third, second, first = (p[0] for p in pages)  # newest first
        assert [(a["attempt"], a["status_code"], a["outcome"]) for a in (first, second, third)] == [
            (1, 500, "failed"),
            (2, 503, "failed"),
            (3, 200, "delivered"),
        ]
        assert all(a["delivery_status"] == "delivered" for a in (first, second, third))  # the delivery, now
        # each failure logged when the backoff retries it, and the retry came no earlier
        for failed, retry in ((first, second), (second, third)):
            assert failed["retry_at"] is not None and failed["error"] == f"HTTP {failed['status_code']}"
            when = {
                k: datetime.fromisoformat(v)
                for k, v in (
                    ("tried", failed["started_at"]),
                    ("retry_at", failed["retry_at"]),
                    ("retried", retry["started_at"]),
                )
            }
            assert when["tried"] < when["retry_at"] <= when["retried"]
        assert third["retry_at"] is None and third["error"] is None
        assert world.log(ep["id"], "bob") == [third, second, first]  # one page holds them all
        for bad in ("not-a-cursor", "MjAyNi0wMS0wMVQwMDowMDowMHx4"):  # garbage, and a cursor of another shape
            r = world.client.get(url, params={"cursor": bad}, headers=world.h("bob"))
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "cursor", r.text
        assert world.client.get(url, params={"limit": 101}, headers=world.h("bob")).status_code == 422
        assert world.client.delete(f"/v1/webhooks/{ep['id']}", headers=world.h("bob")).status_code == 204


def test_an_endpoint_is_disabled_after_n_failures_and_its_owner_re_enables_it(world: World) -> None:
    with Receiver(default=500) as rx:
        ep = world.register("bob", rx.url, ["submission.received"])
        world.submit("bob")

        def disabled() -> dict | None:  # type: ignore[type-arg]
            e = world.client.get(f"/v1/webhooks/{ep['id']}", headers=world.h("bob")).json()
            return e if not e["active"] else None

        e = wait_for(disabled, 120, "endpoint was not disabled", world.worker)
        assert e["consecutive_failures"] == 3 and "3 consecutive failed attempts" in e["disabled_reason"]
        assert len(rx.requests) == 3  # the third failure disabled it
        (pending,) = world.deliveries(ep["id"])
        assert pending.status == "pending"
        assert pending.id not in dispatch_due(
            world.sessions, make_celery(world.settings), world.settings
        )  # not sent while disabled

        rx._default = 200  # the owner fixed the receiver
        other = world.client.patch(f"/v1/webhooks/{ep['id']}", json={"active": True}, headers=world.h("alice"))
        assert other.status_code == 404  # only its owner
        r = world.client.patch(f"/v1/webhooks/{ep['id']}", json={"active": True}, headers=world.h("bob"))
        assert r.status_code == 200 and r.json()["active"] and r.json()["consecutive_failures"] == 0
        rx.received(4, 60)
        wait_for(lambda: _all_delivered(world, ep["id"]), 60, "not delivered after re-enabling", world.worker)
        assert world.client.delete(f"/v1/webhooks/{ep['id']}", headers=world.h("bob")).status_code == 204


def test_registration_refuses_private_targets_without_the_allowlist(world: World) -> None:
    strict = world.settings.model_copy(update={"webhook_allowlist": ""})
    with TestClient(create_app(strict)) as client, Receiver() as rx:
        for url, reason in (
            (rx.url, "loopback"),
            (f"http://localhost:{rx.port}/", "loopback"),
            ("http://169.254.169.254/latest/meta-data", "cloud metadata"),
            ("http://[fd00:ec2::254]/", "cloud metadata"),
            ("http://10.0.0.8/hook", "private"),
            ("http://nonexistent.invalid/hook", "does not resolve"),
        ):
            r = client.post("/v1/webhooks", json={"url": url}, headers=world.h("alice"))
            assert r.status_code == 422, (url, r.text)
            (err,) = r.json()["errors"]
            assert err["field"] == "url" and reason in err["reason"], (url, err)
        for bad in ("ftp://example.com/x", "http://user:pw@example.com/", "not a url", "http://exa\x00mple.com/"):
            r = client.post("/v1/webhooks", json={"url": bad}, headers=world.h("alice"))
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "url", (bad, r.text)
        r = client.post(
            "/v1/webhooks",
            json={"url": "https://hooks.example/", "events": ["audit.exploded"]},
            headers=world.h("alice"),
        )
        assert r.status_code == 422 and r.json()["errors"][0]["field"].startswith("events")
        assert client.get("/v1/webhooks", headers=world.h("alice")).json() == []  # nothing was stored
        assert rx.requests == []
