"""Settings -> environment variables, for the processes the service starts (the worker of `kaudit serve`)."""

from __future__ import annotations

import os

from app.core.settings import Settings


def settings_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    source = dict(os.environ if base is None else base)
    env = {k: v for k, v in source.items() if not k.startswith("KAUDIT_") and k not in ("DATABASE_URL", "REDIS_URL")}
    env["DATABASE_URL"] = settings.database_url
    if settings.redis_url:
        env["REDIS_URL"] = settings.redis_url
    for name, value in settings.model_dump(exclude={"database_url", "redis_url"}).items():
        if value is not None:
            env["KAUDIT_" + name.upper()] = str(value)
    return env
