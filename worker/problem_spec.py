"""audit.json: what kernel-audit adds beside an upstream definition.

The definition folder stays exactly as upstream ships it; this file carries the
benchmark tolerance, the error budgets judged against the ideal output, the probe
distributions and where the op sits in the training canary.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Tolerance(BaseModel):
    """The benchmark's elementwise rule: |a-b| <= atol + rtol*|b| on >= min_match of elements."""

    model_config = ConfigDict(extra="forbid")
    atol: float = 1e-2
    rtol: float = 1e-2
    min_match: float = Field(0.99, gt=0, le=1)


class BucketBy(BaseModel):
    """How to label reduction groups for per-bucket reports (e.g. rows by index multiplicity)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["index_count", "reduction_length"]
    input: str | None = Field(None, description="index_count: the int input whose value counts label each row")
    axis: str | None = Field(None, description="reduction_length: the axis whose size is the reduction length")


class OutputBudget(BaseModel):
    """Normwise error per reduction group vs fp64, as a ratio to the ideal output's error."""

    model_config = ConfigDict(extra="forbid")
    group_dims: list[int] = Field(
        default_factory=list,
        description="dims that index reduction groups: [0] = each row is a group; [] = the whole tensor",
    )
    max_ratio: float = Field(4.0, gt=1)
    bucket_by: BucketBy | None = None


class InputGenerator(BaseModel):
    """One input of a probe: `kind` names a generator in worker.probes.distributions."""

    model_config = ConfigDict(extra="allow")
    kind: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ProbeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    why: str = Field(description="what real workload or failure mode this probe stands for")
    axes: dict[str, int] = Field(description="var axes on the CPU profile")
    gpu_axes: dict[str, int] | None = Field(None, description="var axes on the GPU profile (default: axes)")
    inputs: dict[str, InputGenerator] = Field(default_factory=dict)
    noncontiguous: list[str] = Field(default_factory=list, description="inputs passed as non-contiguous views")
    adversarial: bool = False
    advisory: bool = Field(
        False,
        description="a finding, not a failure: reported with the verdict, never failing it (a derived plan's "
        "strided probe: SOL-ExecBench hands kernels contiguous tensors, so a kernel that assumes them keeps its contract)",
    )
    base_workload: str | None = Field(
        None,
        description="uuid of a workload: inputs the probe does not list are made as that workload makes them, at the probe's axes",
    )

    def axes_for(self, profile: str) -> dict[str, int]:
        return self.gpu_axes if (profile == "gpu" and self.gpu_axes) else self.axes


# the canary's sites (worker.canary.binding.Site): named here, where the service reads audit.json without torch
CanarySite = Literal[
    "embedding",
    "embedding_norm",
    "norm",
    "loss",
    "linear",
    "glu",
    "add_norm",
    "softmax",
    "rope",
    "attention",
    "moe_routing",
    "attention_decode",
]


class CanarySpec(BaseModel):
    """Where the op sits in the canary's model (worker.canary.matching); without it the site is matched from the
    definition's signature and reference. "none": this op has no canary."""

    model_config = ConfigDict(extra="forbid")
    site: CanarySite | Literal["none"]


class AuditSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    oracle: str = Field("oracle.py::run", description="trusted fp64 implementation, file::function")
    tolerance: Tolerance = Field(default_factory=Tolerance)
    budgets: dict[str, OutputBudget] = Field(default_factory=dict)
    probes: list[ProbeSpec] = Field(default_factory=list)
    order_free_axis: str | None = Field(
        None, description="axis along which permuting inputs must not change outputs (e.g. num_tokens)"
    )
    canary: CanarySpec | None = None
    timing_workload: str | None = Field(None, description="uuid of the workload timed (default: the largest)")
    jitter_axes: bool = Field(
        True,
        description="draw each probe's var axes per audit within +-25% of the stated ones, keeping the power of "
        "two that divides each (up to 16), so that no kernel can be exact only on known shapes",
    )
