"""The stage registry (worker.registry): one place for the stages, their order and their modules; the contract's
StageName accepts what it holds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import Settings
from worker import registry
from worker.engine import parse_stages
from worker.report import StageResult, stage_order


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's registrations stay in this test."""
    monkeypatch.setattr(registry, "_modules", registry.stage_modules())


def test_a_registered_module_is_a_stage_before_the_verdict_and_a_valid_name(fresh: None) -> None:
    assert registry.register_extra_stages(" my_stages.dummy , other.pkg.lint_check") == ("dummy", "lint_check")
    assert stage_order()[-3:] == ("dummy", "lint_check", "verdict")
    assert registry.register_stage("my_stages.dummy") == "dummy"  # again: nothing changes
    assert registry.audit_stages().count("dummy") == 1
    assert StageResult(name="dummy", status="passed", summary="ok").name == "dummy"
    assert parse_stages("dummy") == ("intake", "dummy")


@pytest.mark.parametrize(
    ("module", "why"),
    [
        ("elsewhere.dummy", "already my_stages.dummy"),
        ("elsewhere.verdict", "judges the others"),
        ("my_stages.Dummy", "lowercase letter"),
        ("my-stages.dummy", "not a module path"),
        ("my_stages." + "x" * 33, "up to 31"),
    ],
)
def test_a_name_that_is_taken_or_unstorable_is_refused(fresh: None, module: str, why: str) -> None:
    registry.register_stage("my_stages.dummy")
    with pytest.raises(registry.StageRegistryError, match=why):
        registry.register_stage(module)


def test_an_unregistered_name_is_no_stage() -> None:
    with pytest.raises(ValidationError, match="unknown stage 'dummy'"):
        StageResult(name="dummy", status="passed", summary="")
    with pytest.raises(ValueError, match="unknown stage"):
        parse_stages("intake,dummy")


def test_the_setting_is_checked_at_start_naming_the_variable() -> None:
    with pytest.raises(ValidationError, match="KAUDIT_EXTRA_STAGES: 'my-stages' is not a module path"):
        Settings(extra_stages="my-stages")
    assert Settings(extra_stages="my_stages.dummy").extra_stages == "my_stages.dummy"
