"""The leaderboard table (written when an audit finishes, in the same transaction) and the dashboard pages that read
it, in-process against the real databases (no worker process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import plotly
import pytest
from fastapi.testclient import TestClient
from markupsafe import escape
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker
from svc_support import bootstrap, example

from app.audits import events, repository
from app.audits.repository import stage_statuses
from app.auth.principal import Principal
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.leaderboard.repository import RankChange, refresh_entry
from app.leaderboard.service import leaderboard
from app.main import create_app
from app.models import ApiKey, LeaderboardEntry, Submission
from app.submissions import service as submissions

PROBLEM = "embedding_backward"
PASSED = {"static": "passed", "benchmark": "passed", "probes": "passed"}


class _NoBroker:
    def send(self, audit_id: str, queue: str) -> bool:
        return True


def _submit(sessions: sessionmaker[Session], settings: Settings, submitter: str, name: str) -> tuple[str, str]:
    """A kernel of its own (its source differs by a comment): identical sources would fold into one entry."""
    data = example("pytorch_fp32")
    data["sources"][0]["content"] += f"\n# {submitter}/{name}\n"
    with UnitOfWork(sessions, _NoBroker()) as uow:  # type: ignore[arg-type]
        key = uow.session.scalar(select(ApiKey).where(ApiKey.submitter == submitter))
        assert key is not None
        acc = submissions.submit(
            uow,
            settings,
            Principal(key.id, submitter, frozenset({"submit"})),
            problem_name=PROBLEM,
            problem_hash="h",
            solution_name=name,
            data=data,
            idempotency_key=None,
        )
        return acc.submission_id, acc.audit_id


def _run(
    sessions: sessionmaker[Session],
    audit_id: str,
    kernel_ms: float,
    stages: dict[str, str],
    *,
    commit: bool = True,
    hook: Callable[[Session, str], Any] = events.audit_completed,
) -> Any:
    """What the audit task does: claim, store each stage, then finish and call the hook in one transaction."""
    with sessions.begin() as s:
        assert repository.claim(s, audit_id, "w", 60)
    with sessions.begin() as s:
        for pos, (name, status) in enumerate(stages.items(), start=1):
            metrics: dict[str, Any] = {}
            if name == "benchmark":
                metrics = {
                    "kernel_median_ms": kernel_ms,
                    "reference_median_ms": 1.0,
                    "speedup": 1.0 / kernel_ms,
                    "passes_benchmark": status == "passed",
                }
            repository.store_stage(
                s,
                audit_id,
                "w",
                name=name,
                position=pos,
                status=status,
                summary=f"{name} {status}",
                metrics=metrics,
                evidence={},
                duration_s=1,
                lease_s=60,
            )
        failed = [n for n, st in stages.items() if st == "failed"]
        repository.store_stage(
            s,
            audit_id,
            "w",
            name="verdict",
            position=9,
            status="failed" if failed else "passed",
            summary="",
            metrics={
                "caught_by": failed,
                "passes_benchmark": stages.get("benchmark") == "passed",
                "numerically_sound": stages.get("probes") == "passed" if "probes" in stages else None,
            },
            evidence={},
            duration_s=0,
            lease_s=60,
        )
    s = sessions()
    try:
        s.begin()
        assert repository.finish(s, audit_id, "w", "failed" if failed else "passed", "fail" if failed else "pass", "")
        returned = hook(s, audit_id)
        if commit:
            s.commit()
        else:
            s.rollback()
    finally:
        s.close()
    return returned


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest) -> Iterator[tuple[Settings, sessionmaker[Session]]]:
    settings: Settings = request.getfixturevalue("sqlite_settings" if request.param == "sqlite" else "service_settings")
    bootstrap(settings)
    engine = make_engine(settings)
    yield settings, make_sessionmaker(engine)
    engine.dispose()


def _changes(changes: list[RankChange]) -> set[tuple[str, str, int | None, int | None]]:
    return {(c.submitter, c.board, c.old_rank, c.new_rank) for c in changes}


def test_rows_are_written_with_the_finishing_transaction_and_ranks_move(world) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = world
    # a fast kernel the benchmark passes and the probes catch: ranked on the API's board, not on the audited one
    fast, fast_audit = _submit(sessions, settings, "alice", "fast_bf16")
    caught = {"static": "passed", "benchmark": "passed", "probes": "failed"}
    assert _changes(_run(sessions, fast_audit, 0.05, caught, hook=refresh_entry)) == {("alice", "leaderboard", None, 1)}
    with sessions() as s:
        e = s.get(LeaderboardEntry, fast)
        assert e is not None and (e.rank, e.benchmark_rank, e.audited_rank, e.caught_by) == (1, 1, None, "probes")
        assert stage_statuses(s, [fast_audit])[fast_audit] == caught  # read from its stage results, in stage order
        assert e.numerically_sound is False and e.speedup == pytest.approx(20.0)

    # rolled back with its transaction: an audit whose finish does not commit leaves no row
    _, lost_audit = _submit(sessions, settings, "bob", "never_committed")
    _run(sessions, lost_audit, 0.01, PASSED, commit=False)  # through events.audit_completed
    with sessions() as s:
        assert s.scalar(select(LeaderboardEntry).where(LeaderboardEntry.audit_id == lost_audit)) is None

    _, bob_audit = _submit(sessions, settings, "bob", "bob_fp32")
    assert _changes(_run(sessions, bob_audit, 0.2, PASSED, hook=refresh_entry)) == {
        ("bob", "leaderboard", None, 2),
        ("bob", "audited", None, 1),
    }
    # alice's second kernel, clean and faster than bob's: second on the API's board (every kernel, by speedup) and
    # first on the audited board, pushing bob down on both
    _, second_audit = _submit(sessions, settings, "alice", "alice_fp32")
    assert _changes(_run(sessions, second_audit, 0.1, PASSED, hook=refresh_entry)) == {
        ("alice", "leaderboard", None, 2),
        ("bob", "leaderboard", 2, 3),
        ("alice", "audited", None, 1),
        ("bob", "audited", 1, 2),
    }
    with sessions() as s:
        lb = leaderboard(s, PROBLEM)
        assert [(r.rank, r.submitter, r.kernel_ms) for r in lb.rows] == [
            (1, "alice", 0.05),
            (2, "alice", 0.1),
            (3, "bob", 0.2),
        ]
        assert lb.rows[0].numerically_sound is False and lb.rows[0].passes_benchmark is True
        assert lb.rows[0].verdict == "fail" and lb.rows[0].caught_by == "probes" and lb.rows[0].hardware == "cpu"
        assert lb.rows[0].stages == caught and lb.rows[1].stages == lb.rows[2].stages == PASSED
        sound = leaderboard(s, PROBLEM, sound_only=True)
        assert [(r.rank, r.submitter, r.kernel_ms) for r in sound.rows] == [(1, "alice", 0.1), (2, "bob", 0.2)]


def test_a_late_older_attempt_does_not_replace_a_newer_result(world) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = world
    sid, first = _submit(sessions, settings, "alice", "k")
    _run(sessions, first, 0.1, PASSED)
    with sessions.begin() as s:
        sub = s.get(Submission, sid)
        second = repository.new_audit(
            s, sub, problem_hash="h", attempt=2, reason="re-audit", stages=None, device="cpu", queue="cpu"
        )
        s.flush()
        second_id = second.id
    _run(sessions, second_id, 0.3, {"static": "passed", "benchmark": "passed", "probes": "failed"})
    with sessions.begin() as s:
        assert refresh_entry(s, first) == []  # attempt 1 again (e.g. the reaper): attempt 2 stays
        e = s.get(LeaderboardEntry, sid)
        assert e is not None and (e.attempt, e.kernel_ms, e.caught_by, e.audited_rank) == (2, 0.3, "probes", None)


def _dashboard(settings: Settings, **overrides: Any) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=overrides)))


def test_dashboard_pages_mark_caught_kernels_and_escape_names(world) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = world
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    caught, caught_audit = _submit(sessions, settings, "alice", hostile)
    _run(sessions, caught_audit, 0.05, {"static": "passed", "benchmark": "passed", "probes": "failed"})
    clean, clean_audit = _submit(sessions, settings, "bob", "bob_fp32")
    _run(sessions, clean_audit, 0.2, PASSED)
    with _dashboard(settings) as client:
        home = client.get("/")
        assert home.status_code == 200
        assert f'<tr data-problem="{PROBLEM}">' in home.text
        row = home.text.split(f'<tr data-problem="{PROBLEM}">', 1)[1].split("</tr>", 1)[0]
        nums = [c.split(">")[-1] for c in row.split("</td>")[1:4]]
        assert nums == ["2", "0", "2"] and '?show=caught">1</a>' in row

        page = client.get(f"/problems/{PROBLEM}")
        assert page.status_code == 200 and "<script>alert" not in page.text and "<img src=x" not in page.text
        assert str(escape(hostile)) in page.text  # shown, as text
        caught_row = page.text.split(f'data-submission="{caught}"', 1)[1].split("</tr>", 1)[0]
        assert 'data-caught="true"' in caught_row and "caught by probes" in caught_row
        assert f'href="/submissions/{caught}#stage-probes" title="probes: failed"' in caught_row
        assert (
            '<td class="num audited-rank">—</td>' in caught_row
            and '<td class="num benchmark-rank">1</td>' in caught_row
        )
        clean_row = page.text.split(f'data-submission="{clean}"', 1)[1].split("</tr>", 1)[0]
        assert (
            '<td class="num audited-rank">1</td>' in clean_row and '<td class="num benchmark-rank">2</td>' in clean_row
        )
        only_caught = client.get(f"/problems/{PROBLEM}?show=caught").text
        assert caught in only_caught and clean not in only_caught
        assert client.get(f"/problems/{PROBLEM}?show=bogus").status_code == 422
        assert client.get("/problems/nope").status_code == 404

        sub = client.get(f"/submissions/{caught}")
        assert sub.status_code == 200 and 'id="stage-probes" data-stage="probes" data-status="failed"' in sub.text
        assert str(escape(hostile)) in sub.text and "<script>alert" not in sub.text and "<img src=x" not in sub.text
        live = client.get(f"/submissions/{caught}/live")
        assert live.headers["x-audit-status"] == "failed" and live.text.lstrip().startswith('<section id="audit"')
        assert client.get("/submissions/" + "0" * 32).status_code == 404


def test_plotly_is_served_from_the_installed_package_and_nothing_else_is(world) -> None:  # type: ignore[no-untyped-def]
    settings, _ = world
    with _dashboard(settings) as client:
        js = client.get("/static/plotly.min.js")
        assert (
            js.status_code == 200
            and js.content == (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
        )
        assert client.get("/static/dashboard.js").status_code == 200
        for bad in ("/static/..%2F..%2Fcore%2Fsettings.py", "/static/routes.py", "/static/%2Fetc%2Fpasswd"):
            assert client.get(bad).status_code == 404


def test_a_private_dashboard_needs_a_key_and_never_shows_it(world) -> None:  # type: ignore[no-untyped-def]
    settings, sessions = world
    sid, audit = _submit(sessions, settings, "alice", "k")
    _run(sessions, audit, 0.1, PASSED)
    with sessions() as s:
        from app.auth.keys import create_api_key

        _, key = create_api_key(s, "viewer")
        s.commit()
    with _dashboard(settings, dashboard_public=False) as client:
        for path in ("/", f"/problems/{PROBLEM}", f"/submissions/{sid}", f"/submissions/{sid}/live"):
            r = client.get(path)
            assert r.status_code == 401 and "needs an API key" in r.text and "alice" not in r.text
        assert client.get("/?key=ka_not_a_key").status_code == 401
        assert (
            client.get(f"/problems/{PROBLEM}?show=all&key={key}").status_code == 401
        )  # a key in an address opens nothing
    with _dashboard(
        settings, dashboard_public=False
    ) as client:  # the locked page's form: a POST, the key in no address
        assert client.post("/key", data={"key": "ka_not_a_key", "next": "/"}).status_code == 401
        for hostile in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "/\t/evil.example"):
            r = client.post("/key", data={"key": key, "next": hostile}, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == "/"
        r = client.post("/key", data={"key": key, "next": f"/problems/{PROBLEM}"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"/problems/{PROBLEM}" and key not in r.text
        page = client.get(f"/problems/{PROBLEM}")  # the cookie carries the key from now on
        assert page.status_code == 200 and "alice" in page.text and key not in page.text


def test_a_pooled_connection_killed_while_idle_is_replaced_at_checkout(pg_url: str) -> None:
    """The pool pings only connections idle past a threshold (the leaderboard's GET skips the ping); one that died
    while idle must still be replaced before a request uses it."""
    import psycopg
    from sqlalchemy import create_engine
    from svc_support import PG_ADMIN_URL

    from app.core.db import ping_when_idle

    engine = create_engine(Settings(database_url=pg_url).sqlalchemy_url, pool_size=1, max_overflow=0)
    ping_when_idle(engine, after_s=0.0)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("select pg_backend_pid()")).scalar_one()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            assert admin.execute("select pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        with engine.connect() as conn:  # the dead one is pinged, dropped and replaced: no error reaches the caller
            assert conn.execute(text("select pg_backend_pid()")).scalar_one() != pid
    finally:
        engine.dispose()


def test_a_running_audit_shows_its_stages_but_not_their_evidence_until_it_ends(world) -> None:  # type: ignore[no-untyped-def]
    """Evidence names the seeds the probes drew from the audit's secret seed: a public page must not show it while
    the submitter could still use it."""
    settings, sessions = world
    sid, audit = _submit(sessions, settings, "alice", "k")
    with sessions.begin() as s:
        assert repository.claim(s, audit, "w", 60)
        repository.store_stage(
            s,
            audit,
            "w",
            name="probes",
            position=3,
            status="failed",
            summary="over budget",
            metrics={"diagnosis": ["error grows with index multiplicity"]},
            evidence={"seeds": {"real_text": 987654321}},
            duration_s=1,
            lease_s=60,
        )
    with _dashboard(settings) as client:
        live = client.get(f"/submissions/{sid}/live")
        assert live.headers["x-audit-status"] == "running" and 'data-finished="false"' in live.text
        assert (
            'data-stage="probes" data-status="failed"' in live.text
            and "error grows with index multiplicity" in live.text
        )
        assert "987654321" not in live.text and "987654321" not in client.get(f"/submissions/{sid}").text
        with sessions.begin() as s:
            assert repository.finish(s, audit, "w", "failed", "fail", "caught by probes")
            events.audit_completed(s, audit)
        done = client.get(f"/submissions/{sid}").text
        # evidence is the submitter's only, finished or not (tests/app/test_security_disclosure.py)
        assert 'data-finished="true"' in done and "987654321" not in done


def test_audits_finishing_at_once_rank_from_each_others_rows(service_settings: Settings) -> None:
    """Two audits of one problem finish in overlapping transactions: the second waits for the first's lock on the
    problem and ranks with its row (without the lock, each would rank alone and both would be first)."""
    import threading

    from svc_support import wait_for

    bootstrap(service_settings)
    engine = make_engine(service_settings)
    sessions = make_sessionmaker(engine)
    try:
        (a_sid, a), (b_sid, b) = (
            _submit(sessions, service_settings, "alice", "a"),
            _submit(sessions, service_settings, "bob", "b"),
        )
        for audit, ms in ((a, 0.1), (b, 0.2)):
            _run(sessions, audit, ms, PASSED, commit=False)  # stages stored and committed; the finish rolled back
        first = sessions()
        first.begin()
        assert repository.finish(first, a, "w", "passed", "pass", "")
        refresh_entry(first, a)  # holds the problem's lock until it commits
        done = threading.Event()

        def second() -> None:
            with sessions.begin() as s:
                assert repository.finish(s, b, "w", "passed", "pass", "")
                refresh_entry(s, b)
            done.set()

        t = threading.Thread(target=second)
        t.start()
        # autocommit: pg_stat_activity is read once per transaction, so each look must be its own transaction
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as probe:
            wait_for(
                lambda: probe.execute(
                    select(func.count())
                    .select_from(text("pg_stat_activity"))
                    .where(text("wait_event_type = 'Lock' and datname = current_database()"))
                ).scalar_one()
                == 1,
                30,
                "the second finish did not wait for the problem's lock",
            )
        assert not done.is_set()
        first.commit()
        first.close()
        t.join(30)
        assert done.is_set()
        with sessions() as s:
            ranks = {e.submission_id: (e.rank, e.audited_rank) for e in s.scalars(select(LeaderboardEntry))}
        assert ranks == {a_sid: (1, 1), b_sid: (2, 2)}
    finally:
        engine.dispose()
