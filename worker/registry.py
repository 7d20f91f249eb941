"""The stage registry: the one place that says which stages an audit runs, in which order, and where each one's code
is. A stage is a module (or package) with `run(ctx: AuditContext) -> StageResult`; its name is the module's last
dotted part (`worker.stages.probes` is "probes"). The verdict, which judges the others, always comes last.

It holds module paths, not modules, and imports nothing: the service reads the names (the contract's validation in
worker.report, a running audit's progress, the leaderboard's badges) without importing a stage or torch, and the
engine imports each stage's module when it runs it (worker.engine). A stage outside worker/stages comes in through
`register_stage`, which each process of the service calls at start for the setting KAUDIT_EXTRA_STAGES."""

from __future__ import annotations

import re

VERDICT = "verdict"
INTAKE = "intake"
EXTRA_STAGES_VARIABLE = "KAUDIT_EXTRA_STAGES"

# the stages in the order they run: intake first, since no other stage can judge a kernel that does not import
BUILT_IN: tuple[str, ...] = (
    "worker.stages.intake",
    "worker.stages.static",
    "worker.stages.benchmark",
    "worker.stages.probes",
    "worker.stages.canary",
)

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# a name is stored in stage_results.name (32 characters) and shown in URLs (#stage-<name>) and HTML attributes
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")

_modules: dict[str, str] = {}  # stage name -> module, in the order the stages run


class StageRegistryError(ValueError):
    pass


def stage_name(module: str) -> str:
    """The name of the stage in `module` (its last dotted part), checked."""
    if not _MODULE.fullmatch(module):
        raise StageRegistryError(f"'{module}' is not a module path such as my_package.my_stage")
    name = module.rsplit(".", 1)[-1]
    if not _NAME.fullmatch(name):
        raise StageRegistryError(
            f"stage name '{name}' (the last part of '{module}'): a lowercase letter, then up to 31 "
            "lowercase letters, digits or underscores"
        )
    if name == VERDICT:
        raise StageRegistryError(f"'{VERDICT}' is the engine's own last stage, which judges the others")
    return name


def register_stage(module: str) -> str:
    """Add the stage in `module` after the registered ones (the verdict still judges last) and return its name.

    Registering the same module again changes nothing, so every entry point of a process may register what its
    settings name; a second module under a registered name is refused rather than shadowing the first."""
    name = stage_name(module)
    known = _modules.get(name)
    if known is not None and known != module:
        raise StageRegistryError(f"stage '{name}' is already {known}; '{module}' would shadow it")
    _modules[name] = module
    return name


def parse_extra_stages(spec: str | None) -> tuple[str, ...]:
    """The modules a KAUDIT_EXTRA_STAGES value names (comma-separated module paths), each checked."""
    modules = tuple(m.strip() for m in (spec or "").split(",") if m.strip())
    for module in modules:
        stage_name(module)
    return modules


def register_extra_stages(spec: str | None) -> tuple[str, ...]:
    """Register every module a KAUDIT_EXTRA_STAGES value names, in its order; their stage names."""
    return tuple(register_stage(m) for m in parse_extra_stages(spec))


def stage_modules() -> dict[str, str]:
    """Stage name -> module, for every stage an audit runs, in order (the verdict is not among them)."""
    return dict(_modules)


def audit_stages() -> tuple[str, ...]:
    """The stages an audit runs, in order; the verdict, which judges them, is not one."""
    return tuple(_modules)


def stage_order() -> tuple[str, ...]:
    """Every stage a report holds, in the order they run and are shown: the audit's stages, then the verdict."""
    return (*_modules, VERDICT)


def is_stage(name: str) -> bool:
    return name in _modules or name == VERDICT


for _module in BUILT_IN:
    register_stage(_module)
