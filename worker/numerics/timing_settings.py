"""The benchmark timing's knobs, read from the worker's environment (the worker has no settings object of its own;
the API's `app.core.settings` is not imported by the engine).

KAUDIT_PEAK_BANDWIDTH_BYTES_PER_S   peak memory bandwidth for the timing floor, overriding the device's own
                                    figure (worker.numerics.floor); on the CPU it is the only source of a floor
KAUDIT_RETIME_REL_WIDTH_GPU / _CPU  re-time once when the speedup interval's (hi - lo) / speedup exceeds this
KAUDIT_TIMING_BUDGET_S              GPU: seconds of kernel calls one timed pass may take (default 60); a kernel whose
                                    calls are slower gets fewer timed calls (worker.stages.benchmark.timed.plan_blocks)
KAUDIT_TIMING_LOCK                  0: no per-device lock around the timed window (worker.numerics.timed_window)
KAUDIT_TIMING_LOCK_DIR              where the lock files live (default /dev/shm: shared by every worker process
                                    of the host, gone at reboot)
KAUDIT_LOCK_GPU_CLOCKS              'max' or a frequency in MHz: lock the GPU's graphics clock for the timed window
                                    (`nvidia-smi -lgc`, needs root); unset: clocks are left alone
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator

PREFIX = "KAUDIT_"
BANDWIDTH_ENV = PREFIX + "PEAK_BANDWIDTH_BYTES_PER_S"


class TimingSettings(BaseModel):
    peak_bandwidth_bytes_per_s: float | None = Field(None, gt=0)
    # a quiet GPU gives intervals of a few percent (100 CUDA-event calls); the CPU's round trips through the sandbox
    # are noisier and its figures only indicative, so only a very wide CPU interval is worth the interpreter's time
    retime_rel_width_gpu: float = Field(0.10, gt=0)
    retime_rel_width_cpu: float = Field(0.50, gt=0)
    # a quick kernel's full pass takes well under a second; only calls of about half a second or more meet it
    timing_budget_s: float = Field(60.0, gt=0)
    timing_lock: bool = True
    timing_lock_dir: Path = Path("/dev/shm")
    lock_gpu_clocks: str | None = None

    @field_validator("lock_gpu_clocks")
    @classmethod
    def _clocks(cls, v: str | None) -> str | None:
        if v is None or v == "" or v.lower() in ("0", "false", "no", "off"):
            return None
        if v.lower() != "max" and not (v.isdigit() and int(v) > 0):
            raise ValueError("KAUDIT_LOCK_GPU_CLOCKS is 'max' or a frequency in MHz")
        return v.lower()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TimingSettings:
        source = os.environ if env is None else env
        values = {name: source[PREFIX + name.upper()] for name in cls.model_fields if PREFIX + name.upper() in source}
        try:
            return cls.model_validate(values)
        except ValidationError as err:  # name the variable the operator set, not the field
            bad = "; ".join(
                f"{PREFIX}{str(e['loc'][0]).upper()}={values.get(str(e['loc'][0]))!r}: {e['msg']}" for e in err.errors()
            )
            raise ValueError(f"worker timing settings: {bad}") from None

    def retime_threshold(self, device: str) -> float:
        return self.retime_rel_width_gpu if device.startswith("cuda") else self.retime_rel_width_cpu
