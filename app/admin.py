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
from app.core.unit_of_work import UnitOfWork
from app.problems.service import sync_and_enqueue


def init(settings: Settings) -> None:
    from app.jobs.celery import make_celery

    migrate.upgrade(settings)
    engine = make_engine(settings)
    with UnitOfWork(make_sessionmaker(engine), AuditQueue(make_celery(settings))) as uow:
        result = sync_and_enqueue(uow, settings)
    engine.dispose()
    print(f"migrated; problems added {result.added}, changed {result.changed} ({result.reaudits} re-audits queued)")


def create_key(settings: Settings, submitter: str, admin: bool) -> None:
    engine = make_engine(settings)
    with UnitOfWork(make_sessionmaker(engine), None) as uow:
        _, key = create_api_key(uow.session, submitter, ("submit", "admin") if admin else ("submit",))
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
