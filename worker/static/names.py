"""Alias resolution for the static scan: which local names stand for which modules or imported objects.

`import time as t; t.perf_counter = f` is `time.perf_counter` patched, and `c = torch.cuda` makes `c`
an alias of `torch.cuda` from there on, so renaming does not hide a name from the rule tables.
"""

from __future__ import annotations

import ast


class ImportAliases:
    """Local name -> dotted name it was bound to by an import (or by assigning a module to a name)."""

    def __init__(self) -> None:
        self._table: dict[str, str] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def get(self, name: str) -> str | None:
        return self._table.get(name)

    def bind(self, local: str, dotted: str) -> None:
        self._table[local] = dotted

    def roots(self) -> set[str]:
        """The top-level modules some alias points into."""
        return {v.split(".")[0] for v in self._table.values()}

    def bind_import(self, node: ast.Import) -> None:
        for a in node.names:
            root = a.name.split(".")[0]
            self._table[a.asname or root] = a.name if a.asname else root

    def bind_from_import(self, node: ast.ImportFrom) -> None:
        """`from m import x as y`: y is m.x; a relative import keeps its dots so it never matches a module table."""
        prefix = ("." * node.level) + (node.module or "")
        for a in node.names:
            if node.level == 0:
                self._table[a.asname or a.name] = f"{node.module}.{a.name}" if node.module else a.name
            else:
                self._table[a.asname or a.name] = f"{prefix}.{a.name}"

    def prescan(self, tree: ast.Module) -> None:
        """Bind the module's top-level absolute imports before anything is visited (functions use them above them)."""
        for n in tree.body:
            if isinstance(n, ast.Import):
                self.bind_import(n)
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                self.bind_from_import(n)

    def qualname(self, node: ast.AST) -> str | None:
        """Dotted name with the root resolved through imports; None when it is not a plain name chain."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call):  # e.g. torch.cuda.current_stream().x: keep the callee's name
            inner = self.qualname(node.func)
            return ".".join([inner, *reversed(parts)]) if inner else None
        if not isinstance(node, ast.Name):
            return None
        root = self._table.get(node.id, node.id)
        return ".".join([root, *reversed(parts)])

    def imported_root(self, node: ast.AST) -> bool:
        """The expression's root name was bound by an import (or is an alias of a module)."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self._table


def call_leaf(node: ast.Call) -> str:
    """The called name's last part: `x.to(...)` -> "to", `open(...)` -> "open"."""
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
