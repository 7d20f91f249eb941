"""Cache detection for the static scan: which containers outlive a call, and what their keys are built from.

A key built from object identity (`data_ptr()`, `id()`, storage) replays old outputs (rule output-cache,
fail); a key built from input values (`x[0].item()`, `x[:8].tolist()`) replays them whenever those values
repeat, which a timing loop over one input always does (rule value-keyed-cache, fail); a key built from shapes is how workspaces are reused as well as how outputs are replayed
(rule shape-keyed-cache, warn). Keys are followed through local names (`key = x.data_ptr(); _C[key]`) and
through module-level helper functions that return one (`def _key(x): return x[:4].tolist()`; `_C[_key(x)]`).
"""

from __future__ import annotations

import ast

from worker.static.names import ImportAliases
from worker.static.patterns import (
    CONTAINER_CTORS,
    IDENTITY_KEY_ATTRS,
    IDENTITY_KEY_CALLS,
    SHAPE_KEY_ATTRS,
    SHAPE_KEY_CALLS,
    VALUE_KEY_CALLS,
)

KeyKind = tuple[str, str]  # (rule id, what the key is built from)
_STRENGTH = {"output-cache": 2, "value-keyed-cache": 1, "shape-keyed-cache": 0}


def is_container(value: ast.AST, aliases: ImportAliases) -> bool:
    """A literal or constructed dict/list/set: state when it lives at module level or as a default."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp)):
        return True
    if isinstance(value, ast.Call):
        return aliases.qualname(value.func) in CONTAINER_CTORS
    return False


def module_containers(tree: ast.Module, aliases: ImportAliases) -> set[str]:
    """Names of containers assigned at module level, known before the functions that use them are visited."""
    out: set[str] = set()
    for n in tree.body:
        if isinstance(n, ast.Assign) and is_container(n.value, aliases):
            out.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif (
            isinstance(n, ast.AnnAssign)
            and n.value is not None
            and is_container(n.value, aliases)
            and isinstance(n.target, ast.Name)
        ):
            out.add(n.target.id)
    return out


def helper_key_kinds(tree: ast.Module) -> dict[str, KeyKind]:
    """Module-level functions that return a key built from identities, values or shapes, in definition order."""
    helpers: dict[str, KeyKind] = {}
    for fn in tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        tracker = KeyTracker(helpers)
        tracker.enter()
        best: KeyKind | None = None
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                tracker.note_assign(n.targets[0].id, n.value)
            elif isinstance(n, ast.Return) and n.value is not None:
                kind = tracker.kind(n.value)
                if kind and (best is None or _STRENGTH[kind[0]] > _STRENGTH[best[0]]):
                    best = kind
        if best:
            helpers[fn.name] = (best[0], f"{best[1]} (via {fn.name}())")
    return helpers


class KeyTracker:
    """Per function scope: local names holding a value built from identities or shapes; `helpers` are the
    module's functions that return such a value."""

    def __init__(self, helpers: dict[str, KeyKind] | None = None) -> None:
        self._scopes: list[dict[str, KeyKind]] = []
        self._helpers: dict[str, KeyKind] = helpers if helpers is not None else {}

    def enter(self) -> None:
        self._scopes.append({})

    def leave(self) -> None:
        self._scopes.pop()

    def note_assign(self, name: str, value: ast.AST) -> None:
        if not self._scopes:
            return
        kind = self.kind(value)
        if kind:
            self._scopes[-1][name] = kind
        else:
            self._scopes[-1].pop(name, None)

    def kind(self, expr: ast.AST) -> KeyKind | None:
        """(rule, what) when a cache key is built from object identity (fail), input values (fail) or shapes (warn)."""
        local = self._scopes[-1] if self._scopes else {}
        value: str | None = None
        shape: str | None = None
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and n.id in local:
                rule, what = local[n.id]
                if rule == "output-cache":
                    return rule, f"{what} (via {n.id})"
                if rule == "value-keyed-cache":
                    value = value or f"{what} (via {n.id})"
                shape = shape or f"{what} (via {n.id})"
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
                helper = self._helpers.get(name) if isinstance(f, ast.Name) else None
                if helper is not None:
                    if helper[0] == "output-cache":
                        return helper
                    if helper[0] == "value-keyed-cache":
                        value = value or helper[1]
                    shape = shape or helper[1]
                if name in IDENTITY_KEY_CALLS:
                    return "output-cache", f"{name}()"
                if name in VALUE_KEY_CALLS and isinstance(f, ast.Attribute):
                    value = value or f".{name}()"
                if name in SHAPE_KEY_CALLS:
                    shape = shape or f"{name}()"
            if isinstance(n, ast.Attribute):
                if n.attr in IDENTITY_KEY_ATTRS:
                    return "output-cache", f".{n.attr}"
                if n.attr in SHAPE_KEY_ATTRS:
                    shape = shape or f".{n.attr}"
        if value:
            return "value-keyed-cache", value
        return ("shape-keyed-cache", shape) if shape else None
