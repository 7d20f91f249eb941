"""Who may read the catalogue and the leaderboards: anyone when KAUDIT_PUBLIC_READ is true (the default: a public
leaderboard), else only callers with an API key (rate limited like any keyed call)."""

from __future__ import annotations

from fastapi import Request

from app.api.deps import ServicesDep
from app.auth.dependencies import get_principal
from app.auth.principal import Principal


async def require_reader(request: Request, services: ServicesDep) -> Principal | None:
    if services.settings.public_read:
        return None
    return await get_principal(request, services)
