"""The physical floor under a timed call: the bytes the op must touch, over the device's peak memory bandwidth.

A claimed time below it cannot be a real measurement of the op, so the benchmark stage does not trust it; it is not
evidence of cheating either (a wrong bandwidth or byte count would cause it too), so a breach makes the stage `error`
(inconclusive), never `fail`.

Peak bandwidth, first that applies:
  1. the setting KAUDIT_PEAK_BANDWIDTH_BYTES_PER_S (any device; on the CPU the only source: no floor without it);
  2. the device's own properties, where torch exposes them: memory clock (kHz) x 2 (double data rate) x bus width
     (bits) / 8, the figure CUDA's deviceQuery sample prints;
  3. the datasheet peak for the device's name (KNOWN_PEAKS);
  4. an unknown GPU: the fastest peak in that table, so that no honest kernel on it is flagged (the floor is only
     lower than it could be).

Bytes the op must touch (`bytes_touched`):
  - every output, fully: the op must write all of it;
  - every integer or boolean input (indices, masks), fully: the op must read all of it;
  - a floating-point input, fully, unless it is a lookup table: its leading axis appears in no other input's shape
    and some integer input's non-negative values all lie within its rows. Then only the rows those ids select are
    counted: (distinct ids) x (bytes of one row), the fewest over the integer inputs that fit (so a wrong guess of
    which input indexes the table can only lower the floor). A gather reads the rows it is asked for, not the table.
The count is taken on the first timed input set; every timed set is drawn from the same distribution.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from worker.formats import Definition
from worker.numerics.dtypes import to_torch

# vendor datasheet peaks of HBM bandwidth, by a word of the name torch reports; the longest word that matches wins
# ("GB200" over "B200")
KNOWN_PEAKS: dict[str, float] = {"H100": 3.35e12, "H200": 4.8e12, "B200": 8.0e12, "GB200": 8.0e12}

Source = Literal["setting", "device_properties", "name_table", "fastest_known"]


class PeakBandwidth(BaseModel):
    bytes_per_s: float = Field(gt=0)
    source: Source
    device_name: str | None = None


def from_properties(props: object) -> float | None:
    """memory_clock_rate (kHz) and memory_bus_width (bits), where this torch exposes them."""
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
    if (
        not isinstance(clock_khz, int | float)
        or not isinstance(bus_bits, int | float)
        or clock_khz <= 0
        or bus_bits <= 0
    ):
        return None
    return 2.0 * float(clock_khz) * 1e3 * float(bus_bits) / 8.0


def from_name(name: str) -> float | None:
    upper = name.upper().replace("_", " ").replace("-", " ")
    words = set(upper.split())
    for key in sorted(KNOWN_PEAKS, key=len, reverse=True):
        if key in words or any(w.startswith(key) for w in words):
            return KNOWN_PEAKS[key]
    return None


def peak_bandwidth(
    device_name: str | None, props: object | None, *, gpu: bool, setting: float | None = None
) -> PeakBandwidth | None:
    """The peak to divide by (see the module's docstring for the order); None: no floor (a CPU with no setting)."""
    if setting is not None:
        return PeakBandwidth(bytes_per_s=setting, source="setting", device_name=device_name)
    if not gpu:
        return None
    measured = from_properties(props) if props is not None else None
    if measured is not None:
        return PeakBandwidth(bytes_per_s=measured, source="device_properties", device_name=device_name)
    named = from_name(device_name or "")
    if named is not None:
        return PeakBandwidth(bytes_per_s=named, source="name_table", device_name=device_name)
    return PeakBandwidth(bytes_per_s=max(KNOWN_PEAKS.values()), source="fastest_known", device_name=device_name)


def device_peak_bandwidth(device: str, setting: float | None = None) -> PeakBandwidth | None:
    """`peak_bandwidth` for this process's device; `setting`: the worker's KAUDIT_PEAK_BANDWIDTH_BYTES_PER_S
    (worker.numerics.timing_settings), which overrides the device's own figure."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return peak_bandwidth(None, None, gpu=False, setting=setting)
    return peak_bandwidth(
        torch.cuda.get_device_name(dev), torch.cuda.get_device_properties(dev), gpu=True, setting=setting
    )


class Table(BaseModel):
    """A floating-point input counted by the rows its ids select."""

    index: str = Field(description="the integer input whose distinct ids were counted")
    rows: int
    rows_read: int
    row_bytes: int


class BytesTouched(BaseModel):
    total: int
    outputs: int
    inputs: dict[str, int] = Field(description="per tensor input, the bytes counted")
    tables: dict[str, Table] = Field(default_factory=dict)


def _is_index(t: torch.Tensor) -> bool:
    return t.dim() >= 1 and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


def _distinct_rows(ids: torch.Tensor, rows: int) -> int | None:
    """How many distinct rows of a `rows`-row table these ids select, or None when they cannot index it."""
    flat = ids.reshape(-1)
    flat = flat[flat >= 0]  # negative ids are sentinels (padding, ignore_index): they select nothing
    if flat.numel() == 0 or int(flat.max()) >= rows:
        return None
    return int(torch.unique(flat).numel())


def bytes_touched(definition: Definition, args: list[Any], output_specs: list[dict[str, Any]]) -> BytesTouched:
    """The bytes a call must move (see the module's docstring for the rule)."""
    outputs = sum(math.prod(o["shape"]) * to_torch(o["dtype"]).itemsize for o in output_specs)
    specs = list(definition.inputs.items())
    tensors = {name: a for (name, _), a in zip(specs, args) if isinstance(a, torch.Tensor)}
    counted: dict[str, int] = {}
    tables: dict[str, Table] = {}
    for name, spec in specs:
        t = tensors.get(name)
        if t is None:
            continue
        full = t.numel() * t.element_size()
        counted[name] = full
        if _is_index(t) or t.dim() == 0 or not spec.shape:
            continue
        lead = spec.shape[0]
        if any(lead in (other.shape or []) for other_name, other in specs if other_name != name):
            continue  # the leading axis runs along another input: every row is paired with something, and read
        rows = t.shape[0]
        fits = [
            (n, d)
            for n, ids in tensors.items()
            if n != name and _is_index(ids)
            for d in [_distinct_rows(ids, rows)]
            if d is not None
        ]
        if not fits or rows == 0:
            continue
        index, read = min(fits, key=lambda f: f[1])
        row_bytes = full // rows
        tables[name] = Table(index=index, rows=rows, rows_read=read, row_bytes=row_bytes)
        counted[name] = read * row_bytes
    return BytesTouched(total=outputs + sum(counted.values()), outputs=outputs, inputs=counted, tables=tables)


class TimingFloor(BaseModel):
    bytes: int
    bandwidth: PeakBandwidth
    floor_ms: float

    def breached_by(self, median_ms: float) -> bool:
        return median_ms < self.floor_ms


def timing_floor(touched: int, bandwidth: PeakBandwidth | None) -> TimingFloor | None:
    if bandwidth is None:
        return None
    return TimingFloor(bytes=touched, bandwidth=bandwidth, floor_ms=touched / bandwidth.bytes_per_s * 1e3)
