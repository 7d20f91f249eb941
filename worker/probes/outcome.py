"""What one probe found: its reproducible spec and the error of each output."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from worker.numerics.error_metrics import OutputError


class ProbeOutcome(BaseModel):
    name: str
    why: str
    adversarial: bool = False
    advisory: bool = Field(False, description="its failure is reported, not counted against the kernel")
    seed: int
    axes: dict[str, int] = Field(default_factory=dict)
    spec: dict[str, Any] = Field(default_factory=dict, description="the probe as audit.json states it")
    noncontiguous: list[str] = Field(default_factory=list)
    kernel_error: str | None = Field(None, description="the kernel raised or its process died on this probe")
    input_error: str | None = Field(None, description="the probe's inputs could not be built (audit.json problem)")
    not_applicable: str | None = Field(None, description="a derived probe the definition's reference rejects (not run)")
    oracle_note: str | None = Field(
        None, description="generic oracle: what this probe was judged against, where not fp64"
    )
    outputs: list[OutputError] = Field(default_factory=list)
    input_stats: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(
        default_factory=dict, description="seconds per phase: inputs, oracle, kernel, measure"
    )

    @property
    def passed(self) -> bool:
        return self.kernel_error is None and self.input_error is None and all(o.passed for o in self.outputs)

    @property
    def worst_ratio(self) -> float:
        return max((o.worst_ratio for o in self.outputs), default=0.0)

    def metrics(self) -> dict[str, Any]:
        if self.not_applicable:
            return {"not_applicable": self.not_applicable}
        m: dict[str, Any] = {"passed": self.passed, "worst_ratio": round(self.worst_ratio, 3)}
        if self.kernel_error:
            m["kernel_error"] = self.kernel_error
        if self.input_error:
            m["input_error"] = self.input_error
        if self.oracle_note:
            m["oracle_note"] = self.oracle_note
        m["outputs"] = {
            o.output: {
                "worst_ratio": round(o.worst_ratio, 3),
                "max_ratio": o.max_ratio,
                "worst_group": o.worst_group,
                "worst_group_label": o.worst_group_label,
                "rel_err": o.rel_err,
                "ideal_rel_err": o.ideal_rel_err,
                # the yardstick's other end: what honest implementations achieve (both numbers are shown)
                **(
                    {"honest_rel_err": o.honest_rel_err, "honest_worst": o.honest_worst}
                    if o.honest_rel_err is not None
                    else {}
                ),
                "groups": o.groups,
                "floored_groups": o.floored_groups,
                "zero_groups": o.zero_groups,
                "zero_groups_nonzero": o.zero_groups_nonzero,
                "zero_group_examples": o.zero_group_examples,
                "nonfinite": o.nonfinite,
                **({"mismatches": o.mismatches} if o.mismatches is not None else {}),
                "bucket_kind": o.bucket_kind,
                "buckets": [b.model_dump() for b in o.buckets],
            }
            for o in self.outputs
        }
        if self.input_stats:
            m["inputs"] = self.input_stats
        if self.timings:
            m["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
        return m
