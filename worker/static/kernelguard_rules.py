"""kernelguard as a second rule source for the static stage.

kernelguard (https://pypi.org/project/kernelguard/, MIT, by SinatrasC; pinned to 0.3.2 in pyproject.toml)
is a rule-based detector of cheating in GPU-kernel competition submissions: 60-odd regex and AST
detectors (timer and harness monkeypatching, output replay caches keyed on pointers, shapes, values or
call order, lazy tensors, threads and unsynchronised streams, CUDA-graph replay, precision downgrades,
evaluator-mode branches, runtime package installs, obfuscated exec, ...). Its own policy decides which
patterns are proof on their own (it "auto-filters" them); the rest are signals for a reviewer.

Mapping: a pattern kernelguard would auto-filter on its own, or that it rates "critical", is a finding of
rule `kernelguard` (fail); any other pattern is `kernelguard-signal` (warn). Its detectors look at the
whole file and report no line, so these findings carry line 0 and kernelguard's own evidence text.

It runs in a separate Python process (`-I`, one per audit, all files at once) with a time limit: its
regexes read hostile source, and a source built to stall a checker must not stall the worker. Not
finishing in time, or kernelguard failing, only warns (`kernelguard-incomplete`): our own rules still
ran, and kernelguard is slow on large legitimate files (measured: a 0.9 MB file of 20,000 small
functions took over 60 s, where a catalogue kernel takes about 0.3 s including the process start).
"""

from __future__ import annotations

import json
import subprocess
import sys

from pydantic import BaseModel, ValidationError

from worker.formats import Solution
from worker.static.patterns import HARNESS_ROOTS
from worker.static.rules import RULES, Finding

KERNELGUARD_VERSION = "0.3.2"  # the pin in pyproject.toml; tests check the installed one matches
TIME_LIMIT_S = 20.0

# the child: read [{code, entry, harness}, ...] as JSON on stdin, write [[match, ...], ...] on stdout.
# kernelguard's entry point is GPU MODE's `custom_kernel`: ours is the solution's entry function, and our
# harness modules are what it calls trusted modules. Its own prints go to stderr so they cannot corrupt the reply.
_CHILD = """
import json, sys
out = sys.stdout
sys.stdout = sys.stderr
import kernelguard
replies = []
for item in json.load(sys.stdin):
    config = kernelguard.build_default_runtime_config()
    config["entrypoints"]["names"] = [item["entry"], *config["entrypoints"]["names"]]
    config["trusted"]["modules"] = sorted({*config["trusted"]["modules"], *item["harness"]})
    kernelguard.apply_runtime_config(config)
    facts = kernelguard.build_submission_facts(item["code"])
    matches = [m for detector in kernelguard.CODE_DETECTORS for m in detector(facts)]
    replies.append([dict(pattern=m["pattern"], severity=m["severity"], evidence=str(m.get("evidence", "")),
                         proof=kernelguard.classify([m])[0] == "hacked") for m in matches])
json.dump(replies, out)
"""


class KernelguardMatch(BaseModel):
    pattern: str
    severity: str
    evidence: str
    proof: bool  # kernelguard's policy auto-filters on this pattern alone


def _finding(path: str, rule_id: str, detail: str) -> Finding:
    rule = RULES[rule_id]
    return Finding(file=path, line=0, rule=rule.id, severity=rule.severity, message=f"{detail}: {rule.why}")


def _to_finding(path: str, m: KernelguardMatch) -> Finding:
    rule_id = "kernelguard" if m.proof or m.severity == "critical" else "kernelguard-signal"
    return _finding(path, rule_id, f"kernelguard {m.pattern} ({m.severity}): {m.evidence[:200]}")


class _Incomplete(Exception):
    """kernelguard gave no answer (timed out, failed, or replied with something else)."""


def _run_child(items: list[dict[str, object]], time_limit_s: float) -> list[list[KernelguardMatch]]:
    """The matches per source; _Incomplete when there are none to give."""
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD],
            input=json.dumps(items),
            capture_output=True,
            text=True,
            timeout=time_limit_s,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise _Incomplete(f"kernelguard took longer than {time_limit_s:g} s") from e
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or [""]
        raise _Incomplete(f"kernelguard exited {proc.returncode}: {last[0]}")
    try:
        return [[KernelguardMatch.model_validate(m) for m in per_file] for per_file in json.loads(proc.stdout)]
    except (json.JSONDecodeError, TypeError, ValidationError) as e:
        raise _Incomplete(f"kernelguard's reply did not parse: {e}") from e


def scan_solution_with_kernelguard(solution: Solution, time_limit_s: float = TIME_LIMIT_S) -> list[Finding]:
    """kernelguard's findings for every Python source of the solution."""
    files = [s for s in solution.sources if s.path.endswith(".py")]
    if not files:
        return []
    entry = solution.spec.entry_function
    items: list[dict[str, object]] = [
        {"code": s.content, "entry": entry, "harness": list(HARNESS_ROOTS)} for s in files
    ]
    try:
        result = _run_child(items, time_limit_s)
    except _Incomplete as e:
        return [_finding(files[0].path, "kernelguard-incomplete", str(e))]
    seen: set[tuple[str, str]] = set()
    out: list[Finding] = []
    for src, matches in zip(files, result):
        for m in matches:
            if (src.path, m.pattern) not in seen:  # one finding per pattern and file; kernelguard repeats them
                seen.add((src.path, m.pattern))
                out.append(_to_finding(src.path, m))
    return out
