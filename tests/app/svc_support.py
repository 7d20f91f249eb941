"""Helpers for the service tests: real Postgres databases, real Redis, real worker and API processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from app.auth.keys import create_api_key
from app.core import migrate
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.problems.service import sync_catalogue
import contextlib

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get("KAUDIT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KAUDIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
EXAMPLES = ROOT / "kernels" / "embedding_backward" / "solutions"


def postgres_reachable() -> str | None:
    import psycopg

    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=2):
            return None
    except Exception as err:  # noqa: BLE001
        return f"Postgres at {PG_ADMIN_URL} is unreachable ({err}); set KAUDIT_TEST_PG"


def redis_reachable() -> str | None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return None
    except Exception as err:  # noqa: BLE001
        return f"Redis at {REDIS_URL} is unreachable ({err}); set KAUDIT_TEST_REDIS"


def create_pg_database() -> str:
    import psycopg

    name = f"kaudit_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def drop_pg_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_queue(queue: str) -> None:
    """Remove a test queue and kombu's bindings for it from the shared Redis."""
    import redis

    with contextlib.suppress(redis.RedisError):
        redis.Redis.from_url(REDIS_URL).delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")


def bootstrap(settings: Settings) -> dict[str, str]:
    """Migrate, sync the catalogue, and make an admin key and two submitter keys. Returns plaintext keys."""
    from worker.catalogue import load_catalogue

    migrate.upgrade(settings)
    engine = make_engine(settings)
    try:
        with make_sessionmaker(engine)() as s:
            sync_catalogue(s, load_catalogue(), settings)
            keys = {
                "admin": create_api_key(s, "admin", ("submit", "admin"), "100000/minute")[1],
                "alice": create_api_key(s, "alice", ("submit",), "100000/minute")[1],
                "bob": create_api_key(s, "bob", ("submit",), "100000/minute")[1],
            }
            s.commit()
    finally:
        engine.dispose()
    return keys


def bootstrap_at(settings: Settings, revision: str, submitters: Sequence[str]) -> Engine:
    """An older schema, where a migration starts: migrated to `revision`, the catalogue synced, a key per submitter.
    The caller disposes of the engine."""
    from worker.catalogue import load_catalogue

    migrate.upgrade(settings, revision)
    engine = make_engine(settings)
    with make_sessionmaker(engine).begin() as s:
        sync_catalogue(s, load_catalogue(), settings)
        for who in submitters:
            create_api_key(s, who)
    return engine


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    from app.core.envvars import settings_env

    return {**settings_env(settings), **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115
        self.p = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, sig)
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=10)
        self._fh.close()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def start_worker(settings: Settings, log: Path, name: str = "w", queues: str | None = None, **env: str) -> Proc:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "app.jobs.worker",
        "worker",
        "-Q",
        queues or settings.audit_queue,
        "--concurrency",
        "1",
        "--pool",
        "prefork",
        "-n",
        f"{name}-{uuid.uuid4().hex[:6]}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    return Proc(argv, env_for(settings, **env), log)


def start_api(settings: Settings, log: Path, **env: str) -> tuple[Proc, str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "app.main:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = Proc(argv, env_for(settings, **env), log)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _healthy(url), 60, f"API did not start: {log}", proc)
    return proc, url


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(cond: Callable[[], Any], timeout: float, what: str, proc: Proc | None = None, every: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(what + ("\n--- log tail ---\n" + proc.tail() if proc else ""))


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name / "solution.json").read_text())


def slow_import_solution(sleep_s: float) -> dict[str, Any]:
    """A correct kernel whose import sleeps until `sleep_s` from now (a re-import after a crash sleeps only what is
    left): a long-running audit. It keeps no state of its own outside its sandbox (an isolated one cannot)."""
    sol = example("pytorch_fp32")
    src = sol["sources"][0]["content"]
    prelude = f"import time as _time\n_time.sleep(max(0.0, {time.time() + sleep_s!r} - _time.time()))\n"
    sol["sources"][0]["content"] = prelude + src
    sol["name"] = "slow_import_" + uuid.uuid4().hex[:6]
    return sol


def sandbox_started(worker_pid: int) -> bool:
    """A sandbox child (isolated or not) runs below this worker: its audit has reached the submission."""
    for pid in descendants(worker_pid):
        try:
            if b"worker.sandbox.child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (read from /proc), children first seen first."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.extend(kids)
        frontier.extend(kids)
    return out


def kill_tree(proc: Proc) -> None:
    """SIGKILL a worker and everything it started (the sandbox child runs in its own session)."""
    below = descendants(proc.p.pid)
    proc.kill(signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def restart_redis() -> None:
    """Stop the real Redis (it keeps nothing on disk) and start it again: every queued message is gone."""
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    with contextlib.suppress(redis.ConnectionError):
        r.shutdown(nosave=True)
    wait_for(lambda: redis_reachable() is not None, 10, "redis did not stop")
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ],
        check=True,
    )
    wait_for(lambda: redis_reachable() is None, 10, "redis did not come back")
