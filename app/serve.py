"""`kaudit serve`: the embedded default. One command, no servers to install: the API and one worker,
SQLite for storage, Celery's filesystem transport as the broker, the catalogue loaded, an admin key printed."""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from app.audits.queue import AuditQueue
from app.auth.keys import create_api_key
from app.core import migrate
from app.core.db import make_engine, make_sessionmaker
from app.core.envvars import settings_env
from app.core.settings import Settings
from app.core.unit_of_work import UnitOfWork
from app.models import ApiKey
from app.problems.service import sync_and_enqueue


def embedded_settings(
    data_dir: Path, *, device: str = "cpu", stages: str | None = None, base: Settings | None = None
) -> Settings:
    data_dir = data_dir.resolve()
    from worker.sandbox.isolation import namespaces_available

    update = dict(
        database_url=f"sqlite:///{data_dir / 'kaudit.db'}",
        redis_url=None,
        broker_url="filesystem://",
        broker_dir=data_dir / "broker",
        rate_limit_storage_url="memory://",
        device=device,
        uploads_dir=data_dir / "uploads",
    )
    if not namespaces_available():
        # one machine, the user's own kernels: run, but unisolated and saying so (a production worker refuses instead)
        update["isolation"] = "none"
    if stages:
        update["audit_stages"] = stages
    return (base or Settings()).model_copy(update=update)


def prepare(settings: Settings, new_admin_key: bool = False) -> tuple[str | None, list[str]]:
    """Migrate, sync the catalogue (re-auditing changed problems), and make an admin key if there is none."""
    from app.jobs.celery import make_celery

    migrate.upgrade(settings)
    engine = make_engine(settings)
    try:
        with UnitOfWork(make_sessionmaker(engine), AuditQueue(make_celery(settings))) as uow:
            result = sync_and_enqueue(uow, settings)
            admin = uow.session.scalar(
                select(ApiKey).where(ApiKey.scopes.contains("admin"), ApiKey.revoked_at.is_(None))
            )
            plaintext = None
            if admin is None or new_admin_key:
                _, plaintext = create_api_key(uow.session, "admin", ("submit", "admin"))
    finally:
        engine.dispose()
    return plaintext, [*result.added, *result.changed, *result.unchanged]


def start_worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    """The audit worker: one audit at a time (prefork: torch and the engine load in its pool process)."""
    return _celery_worker(settings, log, settings.audit_queue, "kaudit-embedded", pool="prefork", concurrency=1)


def start_webhook_worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    """Webhook deliveries get a worker of their own, so a long audit never holds them back (behind one worker,
    `submission.received` waited for the audit before it). Threads: a delivery is an HTTP request, and a threads
    pool loads neither torch nor the engine."""
    return _celery_worker(settings, log, settings.webhook_queue, "kaudit-webhooks", pool="threads", concurrency=4)


def _celery_worker(
    settings: Settings, log: Path, queues: str, name: str, *, pool: str, concurrency: int
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "app.jobs.worker",
        "worker",
        "-Q",
        queues,
        "--concurrency",
        str(concurrency),
        "--pool",
        pool,
        "-n",
        f"{name}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    fh = open(log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
    # run in the data folder: whatever a worker writes to a relative path lands there, not in the user's cwd
    return subprocess.Popen(
        argv,
        env=settings_env(settings),
        stdout=fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
        cwd=log.parent,
    )


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each (a warm shutdown), then wait; kill what is still running after 15 s."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _die_with_parent() -> None:
    """Linux: the worker gets SIGTERM if `kaudit serve` dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _exit_on_sigterm(_sig: int, _frame: object) -> None:
    raise SystemExit(0)


class PortUnavailable(OSError):
    """The address to serve on cannot be bound (taken, or not this machine's)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, bound before anything is printed, so a taken port is one clear error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise PortUnavailable(f"cannot listen on {host}:{port}: {err.strerror or err}") from err
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a port in TIME_WAIT is reusable
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        taken = err.errno == errno.EADDRINUSE
        why = "the port is in use by another process; pick another with --port" if taken else (err.strerror or str(err))
        raise PortUnavailable(f"cannot listen on {host}:{port}: {why}") from err
    return sock


def serve(
    data_dir: Path, host: str, port: int, *, device: str = "cpu", stages: str | None = None, new_admin_key: bool = False
) -> None:
    """Bind, prepare, start the worker, then print the URL: what is printed is already reachable. Raises PortUnavailable."""
    import uvicorn

    from app.core import access_log
    from app.main import create_app

    sock = bind(host, port)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        settings = embedded_settings(data_dir, device=device, stages=stages)
        key, problems = prepare(settings, new_admin_key)
        workers.append(start_worker(settings, data_dir / "worker.log"))
        workers.append(start_webhook_worker(settings, data_dir / "webhooks.log"))
    except BaseException:
        sock.close()
        stop_workers(workers)
        raise
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    print(f"kernel-audit is running at {url}  (API docs: {url}/docs)", flush=True)
    print(f"  problems: {', '.join(problems)}", flush=True)
    print(
        f"  data: {data_dir.resolve()} (SQLite, filesystem broker); worker logs: {data_dir / 'worker.log'}, "
        f"{data_dir / 'webhooks.log'}",
        flush=True,
    )
    if settings.isolation == "none":
        print(
            "  WARNING: bubblewrap is not available here, so submissions run UNISOLATED (as you, network open): "
            "audit only your own kernels (install the 'bubblewrap' package to isolate them)",
            flush=True,
        )
    if key:
        print(f"  admin API key (shown once, only its hash is stored): {key}", flush=True)
    else:
        print("  an admin API key exists already; `kaudit serve --new-admin-key` prints a new one", flush=True)
    print(
        f"  submit: curl -H 'Authorization: Bearer <key>' -H 'content-type: application/json' "
        f"--data @kernels/embedding_backward/solutions/pytorch_fp32/solution.json {url}/v1/submissions",
        flush=True,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down: make SIGTERM an exception, so the
    # workers are stopped below rather than orphaned
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        # its access lines (info level) keep the path and drop the query string (app.core.access_log)
        server = uvicorn.Server(
            uvicorn.Config(create_app(settings), log_level="warning", log_config=access_log.log_config())
        )
        server.run(sockets=[sock])
    finally:
        sock.close()
        stop_workers(workers)
