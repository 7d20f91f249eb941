"""Run the Alembic migrations from code (tests, `kaudit serve`, the compose migration step)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from app.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings.sqlalchemy_url), revision)


def downgrade(settings: Settings, revision: str = "base") -> None:
    command.downgrade(alembic_config(settings.sqlalchemy_url), revision)
