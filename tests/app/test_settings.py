"""Settings that would silently disable a safeguard are refused at start-up."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import Settings


def test_soft_time_limit_must_be_below_the_hard_one() -> None:
    # with soft >= hard, Celery's prefork pool never arms the hard limit: refuse the configuration
    with pytest.raises(ValidationError, match="must be below KAUDIT_HARD_TIME_LIMIT_S"):
        Settings(soft_time_limit_s=100, hard_time_limit_s=5)
    with pytest.raises(ValidationError, match="must be below"):
        Settings(soft_time_limit_s=60, hard_time_limit_s=60)
    ok = Settings(soft_time_limit_s=59, hard_time_limit_s=60)
    assert ok.visibility_timeout_s > ok.hard_time_limit_s


def test_soft_and_hard_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAUDIT_SOFT_TIME_LIMIT_S", "7200")
    monkeypatch.setenv("KAUDIT_HARD_TIME_LIMIT_S", "7000")
    with pytest.raises(ValidationError, match=r"\(7200\) must be below KAUDIT_HARD_TIME_LIMIT_S \(7000\)"):
        Settings()
