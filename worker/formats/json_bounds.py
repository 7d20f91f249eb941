"""Parse untrusted JSON with its nesting depth checked first, and walk parsed values without recursion.

`json.loads` recurses once per nesting level: a body of a few thousand `[` raises RecursionError (an HTTP 500 or a
traceback), so the depth is measured on the text before it is parsed, in linear time and without recursion."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

# solution.json, definition.json and workload lines nest a few levels deep; 64 leaves a wide margin
MAX_JSON_DEPTH = 64

# a string (its closing quote optional, so an unterminated one is consumed once: linear time) or a bracket
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]', re.DOTALL)
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonTooDeep(ValueError):
    """The document nests deeper than the limit."""


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (brackets inside strings do not count)."""
    steps = (_STEP[t] for t in _TOKEN.findall(text) if t in _STEP)
    return max(accumulate(steps), default=0)


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, refusing documents nested deeper than `max_depth` before parsing them.

    Raises JsonTooDeep, json.JSONDecodeError or UnicodeDecodeError."""
    if isinstance(text, bytes):
        text = text.decode()
    depth = depth_over(text, max_depth)
    if depth is not None:
        raise JsonTooDeep(f"nested {depth} levels deep; at most {max_depth} are allowed")
    return json.loads(text)


def depth_over(text: str, max_depth: int = MAX_JSON_DEPTH) -> int | None:
    """The nesting depth of `text` if it is over `max_depth`, else None (cheap when few brackets are open)."""
    if text.count("[") + text.count("{") <= max_depth:
        return None
    depth = json_depth(text)
    return depth if depth > max_depth else None


def walk_strings(value: Any) -> Iterator[str]:
    """Every string in a parsed JSON value, keys included, without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
