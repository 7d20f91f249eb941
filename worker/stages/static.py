"""Stage 2, static: scan the sources for known cheat patterns (docs/design.md, "Known ways a submission cheats a verifier").

The scan walks each Python source's AST with import aliases resolved
(`import time as t; t.perf_counter = f` is `time.perf_counter` patched), so it is
not fooled by renaming the way a regex is. Each finding names the file, the line,
a rule id and why the pattern matters. Rules of severity "fail" fail the stage;
"warn" rules (precision downgrades, pointer use, state kept across calls) are
reported but do not fail it: correct kernels cast to bf16 at the end, and the
numerics stages judge whether a downcast hurts.

A second rule source, kernelguard from PyPI (worker/static/kernelguard_rules.py),
runs beside our own rules in a separate process; its proof-level patterns fail,
its signals warn.

A static scan is a first line only: anything it misses at run time is caught by
the sandbox (timers checked for tampering, outputs poisoned, fresh inputs).
"""

from __future__ import annotations

from collections.abc import Iterator

from worker.context import AuditContext
from worker.stages.result import StageResult, StageStatus
from worker.static.kernelguard_rules import (
    KERNELGUARD_VERSION,
    scan_solution_with_kernelguard,
)
from worker.static.rules import ALL_RULES, Finding, Severity
from worker.static.scanner import scan_solution

NAME = "static"


def _iter_rules(findings: list[Finding], severity: Severity) -> Iterator[str]:
    seen: set[str] = set()
    for f in findings:
        if f.severity == severity and f.rule not in seen:
            seen.add(f.rule)
            yield f.rule


def run(ctx: AuditContext) -> StageResult:
    findings = [*scan_solution(ctx.solution), *scan_solution_with_kernelguard(ctx.solution)]
    fails = [f for f in findings if f.severity == "fail"]
    warns = [f for f in findings if f.severity == "warn"]
    metrics = {
        "files": len(ctx.solution.sources),
        "fail_findings": len(fails),
        "warn_findings": len(warns),
        "fail_rules": list(_iter_rules(findings, "fail")),
        "warn_rules": list(_iter_rules(findings, "warn")),
    }
    evidence = {
        # exactly the paths the sandbox writes (canonical, distinct: worker.formats.solution.check_source_path)
        "paths": [s.path for s in ctx.solution.sources],
        "findings": [f.model_dump() for f in findings],
        "rules": {r.id: r.severity for r in ALL_RULES},
        "rule_sources": {"kaudit": "worker/static", "kernelguard": KERNELGUARD_VERSION},
    }
    warn_note = f" ({len(warns)} warning(s): {', '.join(metrics['warn_rules'])})" if warns else ""
    if fails:
        first = fails[0]
        more = f" and {len(fails) - 1} more" if len(fails) > 1 else ""
        summary = f"{first.file}:{first.line} [{first.rule}] {first.message}{more}"
        return StageResult(name=NAME, status=StageStatus.failed, summary=summary, metrics=metrics, evidence=evidence)
    return StageResult(
        name=NAME,
        status=StageStatus.passed,
        summary=f"no cheat patterns in {len(ctx.solution.sources)} file(s){warn_note}",
        metrics=metrics,
        evidence=evidence,
    )
