"""What makes two runs the same kernel on the same board: a content hash of the code, and the hardware it ran on."""

from __future__ import annotations

import hashlib
import json
from typing import Any

CPU = "cpu"


def kernel_hash(solution: dict[str, Any]) -> str:
    """sha256 of the solution's sources (path and content, in path order), entry point and languages, as stored.

    Names, descriptions, authors and target hardware are left out: the same code submitted again under another
    name is the same kernel. The older single `language` counts as a one-element `languages`."""
    spec = solution.get("spec") if isinstance(solution.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    languages = spec.get("languages")
    if languages is None and spec.get("language") is not None:
        languages = [spec["language"]]
    sources = sorted(
        ((str(s.get("path")), str(s.get("content"))) for s in solution.get("sources") or [] if isinstance(s, dict))
    )
    body = {
        "sources": sources,
        "entry_point": spec.get("entry_point"),
        "languages": sorted(str(x) for x in languages or []),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def hardware(device: str | None, benchmark_metrics: dict[str, Any], benchmark_evidence: dict[str, Any]) -> str:
    """The board a run belongs to: 'cpu', or the GPU's name. The benchmark stage records the name it timed on
    (`timing.hardware`); audits from before it did carry the SOL-ExecBench environment (`NVIDIA_H200`) instead;
    failing both, the audit's device kind ('cuda')."""
    kind = (device or CPU).split(":")[0]
    if kind == CPU:
        return CPU
    timing = benchmark_metrics.get("timing")
    named = timing.get("hardware") if isinstance(timing, dict) else None
    if isinstance(named, str) and named:
        return named
    env = benchmark_evidence.get("environment")
    traced = env.get("hardware") if isinstance(env, dict) else None
    if isinstance(traced, str) and traced and not traced.startswith("CPU_"):
        return traced.replace("_", " ")
    return kind
