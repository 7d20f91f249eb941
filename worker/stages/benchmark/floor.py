"""The physical floor: no median call may beat the bytes it must touch over the device's peak bandwidth
(worker.numerics.floor). A time below it is a forged or broken clock, not a fast kernel, so a breach makes the
stage inconclusive (`error`), never a pass or a fail."""

from __future__ import annotations

from typing import Any

from worker.context import AuditContext
from worker.formats import Definition
from worker.inputs import Case
from worker.numerics.floor import bytes_touched, device_peak_bandwidth, timing_floor
from worker.numerics.timing import TimingSample
from worker.stages.benchmark.failure import Failure
from worker.stages.result import StageStatus

FLOOR_PHRASE = "timing below the physical floor, not trusted"


def check_floor(
    ctx: AuditContext,
    definition: Definition,
    args: list[Any],
    first: Case,
    kernel: TimingSample,
    timing: dict[str, Any],
    where: str,
    bandwidth_setting: float | None,
) -> None:
    """The median call may not beat the bytes it must touch over the device's peak bandwidth (worker.numerics.floor).
    A breach is inconclusive: the stage is `error`, not `fail`."""
    touched = bytes_touched(definition, args, first.output_specs(definition))
    floor = timing_floor(touched.total, device_peak_bandwidth(ctx.device, bandwidth_setting))
    timing["bandwidth_floor_ms"] = floor.floor_ms if floor is not None else None
    timing["floor"] = (
        None
        if floor is None
        else {
            "bytes": touched.total,
            "output_bytes": touched.outputs,
            "input_bytes": touched.inputs,
            "tables": {k: v.model_dump() for k, v in touched.tables.items()},
            "bandwidth_bytes_per_s": floor.bandwidth.bytes_per_s,
            "bandwidth_source": floor.bandwidth.source,
        }
    )
    if floor is not None and floor.breached_by(kernel.median_ms):
        raise Failure(
            f"{where}: {FLOOR_PHRASE}: the kernel claims {kernel.median_ms:.4f} ms, below the {floor.floor_ms:.4f} ms "
            f"that touching its {touched.total} bytes takes at {floor.bandwidth.bytes_per_s / 1e12:.2f} TB/s "
            f"({floor.bandwidth.source.replace('_', ' ')})",
            StageStatus.error,
        )
