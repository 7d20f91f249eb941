"""Operator commands for production (the compose file's migration step runs `python -m app.admin init`).

  python -m app.admin init                      migrate, then load the catalogue into the problems table
  python -m app.admin create-key NAME [--admin]  print a new API key (only its hash is stored)
"""

from __future__ import annotations

import argparse

from app.audits.queue import AuditQueue
from app.auth.keys import create_api_key
from app.core import migrate
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from app.problems.service import sync_catalogue


def init(settings: Settings) -> None:
    from app.jobs.celery import make_celery
    from worker.catalogue import DEFAULT_ROOT, load_catalogue

    migrate.upgrade(settings)
    engine = make_engine(settings)
    with make_sessionmaker(engine)() as s:
        result, new_audits = sync_catalogue(s, load_catalogue(settings.catalogue_root or DEFAULT_ROOT), settings)
        s.commit()
    queue = AuditQueue(make_celery(settings))
    for a in new_audits:
        queue.send(a.id, a.queue)
    engine.dispose()
    print(f"migrated; problems added {result.added}, changed {result.changed} ({result.reaudits} re-audits queued)")


def create_key(settings: Settings, submitter: str, admin: bool) -> None:
    engine = make_engine(settings)
    with make_sessionmaker(engine)() as s:
        _, key = create_api_key(s, submitter, ("submit", "admin") if admin else ("submit",))
        s.commit()
    engine.dispose()
    print(key)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.admin")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("init")
    ck = sub.add_parser("create-key")
    ck.add_argument("submitter")
    ck.add_argument("--admin", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings()
    if args.cmd == "init":
        init(settings)
    else:
        create_key(settings, args.submitter, args.admin)


if __name__ == "__main__":
    main()
