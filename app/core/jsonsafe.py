"""Make stage metrics and evidence storable as JSON on Postgres (no NaN/Inf tokens, no numpy scalars)."""

from __future__ import annotations

import math
from typing import Any


def jsonable(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"))
    return str(value)
