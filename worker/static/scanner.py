"""The AST scanner behind the static stage: walks each Python source with import aliases resolved
(`import time as t; t.perf_counter = f` is `time.perf_counter` patched), so renaming does not fool it.

What each rule looks for is in patterns.py; alias resolution in names.py; cache keys in cache_keys.py;
environment sniffing in environment.py; code that is not the scanned Python in foreign_code.py.
This module only walks the tree and reports.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from worker.formats import Language, Solution
from worker.formats.solution import check_source_path
from worker.static import environment, foreign_code
from worker.static.cache_keys import (
    KeyTracker,
    helper_key_kinds,
    is_container,
    module_containers,
)
from worker.static.names import ImportAliases, call_leaf
from worker.static.patterns import (
    CAST_METHODS,
    CHECKER_PREFIXES,
    CONTAINER_METHODS,
    DYNAMIC_CALLS,
    ENV_CALLS,
    ENV_GET_CALLS,
    ENVIRON_NAMES,
    FD_PATH_PREFIXES,
    FILE_CALLS,
    FILE_WRITE_METHODS,
    GRAPH_CALLS,
    HARNESS_DICTS,
    HARNESS_ROOTS,
    INSTALL_MODULES,
    INTROSPECTION_ATTRS,
    INTROSPECTION_CALLS,
    LOW_CAST_METHODS,
    LOW_FLOAT_NAMES,
    LOW_FLOAT_ROOTS,
    LOW_FLOATS,
    MEMO_DECORATORS,
    NETWORK_MODULES,
    PATCH_FREE_PREFIXES,
    PATCH_MODULES,
    PATH_IO_METHODS,
    PRECISION_CALLS,
    PRECISION_FLAGS,
    PROCESS_CALLS_PREFIX,
    RAW_FD_CALLS,
    RAW_MEMORY_MODULES,
    REBIND_ATTRS,
    SETATTR_CALLS,
    SIDE_STREAM_CALLS,
    SNIFF_MODULES,
    TENSOR_BASES,
    THREAD_MODULES,
    TIMER_PREFIXES,
    in_modules,
    starts,
)
from worker.static.rules import RULES, Finding

# methods of a string that compare it with something: `__file__.endswith("sandbox/k.py")` probes the path
_STRING_PROBES = frozenset(
    {"startswith", "endswith", "find", "rfind", "index", "rindex", "count", "__contains__", "split", "partition"}
)
# os.environ methods that take one variable name: a named read, judged by the name
_ENV_NAMED_METHODS = frozenset({"get", "setdefault", "pop", "__getitem__", "__contains__"})
_ENVIRON_ROOTS = tuple(sorted(ENVIRON_NAMES))


def _env_name(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _mentions_file(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node))


def docstring_ids(tree: ast.Module) -> set[int]:
    """ids of the docstring constants (module, classes, functions): prose, not probes."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.add(id(first.value))
    return out


class _Scanner(ast.NodeVisitor):
    def __init__(self, file: str, entry_function: str | None, languages: Sequence[Language], tree: ast.Module) -> None:
        self.file = file
        self.entry_function = entry_function
        self.languages = tuple(languages)
        self.findings: list[Finding] = []
        self.aliases = ImportAliases()
        self.aliases.prescan(tree)
        self.module_containers = module_containers(tree, self.aliases)
        self.keys = KeyTracker(helper_key_kinds(tree))
        self._func_depth = 0
        self._docstrings = docstring_ids(tree)
        self._named_env_reads: set[int] = set()  # ids of os.environ nodes read by one constant name

    # -- helpers -----------------------------------------------------------
    def add(self, node: ast.AST, rule: str, detail: str) -> None:
        r = RULES[rule]
        line = getattr(node, "lineno", 0)
        if any(f.line == line and f.rule == rule for f in self.findings):
            return
        self.findings.append(
            Finding(file=self.file, line=line, rule=rule, severity=r.severity, message=f"{detail}: {r.why}")
        )

    def qualname(self, node: ast.AST) -> str | None:
        return self.aliases.qualname(node)

    def imported_root(self, node: ast.AST) -> bool:
        return self.aliases.imported_root(node)

    # -- imports -----------------------------------------------------------
    def _check_module(self, node: ast.AST, module: str) -> None:
        if in_modules(module, THREAD_MODULES):
            self.add(node, "thread-or-process", f"imports {module}")
        elif in_modules(module, NETWORK_MODULES):
            self.add(node, "network", f"imports {module}")
        elif in_modules(module, HARNESS_ROOTS):
            self.add(node, "harness-patch", f"imports the harness module {module}")
        elif in_modules(module, PATCH_MODULES):
            self.add(node, "monkeypatch", f"imports {module}")
        elif in_modules(module, RAW_MEMORY_MODULES):
            self.add(node, "raw-memory", f"imports {module}")
        elif in_modules(module, INSTALL_MODULES):
            self.add(node, "harness-patch", f"imports {module}, which installs packages or rewires Python's start-up")
        elif in_modules(module, SNIFF_MODULES):
            self.add(node, "env-sniff", f"imports {module}")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(node, a.name)
        self.aliases.bind_import(node)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._check_module(node, node.module)
            for a in node.names:
                full = f"{node.module}.{a.name}"
                self._check_module(node, full)
                self._check_name_use(node, full)
        self.aliases.bind_from_import(node)
        self.generic_visit(node)

    # -- assignments: monkeypatching, module-level caches -------------------
    def _check_store(self, target: ast.AST, value: ast.AST | None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store(t, None)
            return
        if isinstance(target, ast.Starred):
            self._check_store(target.value, None)
            return
        if isinstance(target, ast.Attribute):
            qual = self.qualname(target)
            if qual and self.imported_root(target):
                self._classify_patch(target, qual)
            elif target.attr in PRECISION_FLAGS:
                self.add(target, "precision-downgrade", f"sets {target.attr}")
            elif target.attr in REBIND_ATTRS:
                self.add(target, "monkeypatch", f"rebinds .{target.attr}")
        elif isinstance(target, ast.Subscript):
            base = self.qualname(target.value)
            if base in HARNESS_DICTS or (base or "").endswith(".__dict__"):
                self.add(target, "harness-patch", f"writes into {base}")
            elif base and base.startswith("os.environ"):
                self.add(target, "env-read", "writes os.environ")
        elif isinstance(target, ast.Name):
            self._store_name(target, value)

    def _store_name(self, target: ast.Name, value: ast.AST | None) -> None:
        if value is not None:
            if self._func_depth == 0 and is_container(value, self.aliases):
                self.module_containers.add(target.id)
            self.keys.note_assign(target.id, value)
            q = self.qualname(value)
            if q and isinstance(value, (ast.Name, ast.Attribute)) and self.imported_root(value):
                self.aliases.bind(target.id, q)  # t = time: t is time from here on
        if target.id == "__builtins__":
            self.add(target, "harness-patch", "rebinds __builtins__")

    def _classify_patch(self, node: ast.AST, qual: str) -> None:
        leaf = qual.rsplit(".", 1)[-1]
        if starts(qual, PATCH_FREE_PREFIXES) or qual.endswith(".config") or ".config." in qual:
            if leaf in PRECISION_FLAGS:
                self.add(node, "precision-downgrade", f"sets {qual}")
            return
        if starts(qual, TIMER_PREFIXES):
            self.add(node, "timer-monkeypatch", f"assigns to {qual}")
        elif starts(qual, CHECKER_PREFIXES):
            self.add(node, "checker-monkeypatch", f"assigns to {qual}")
        elif in_modules(qual, HARNESS_ROOTS) or qual.startswith("sys.") or qual.startswith("builtins."):
            self.add(node, "harness-patch", f"assigns to {qual}")
        else:
            self.add(node, "monkeypatch", f"assigns to {qual}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_store(t, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store(node.target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target, None)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_store(t, None)
        self.generic_visit(node)

    # -- functions and classes ------------------------------------------------
    def _visit_func(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            q = self.qualname(d.func if isinstance(d, ast.Call) else d)
            if q in MEMO_DECORATORS:
                if self._func_depth == 0 and node.name == self.entry_function:
                    self.add(d, "memoized-entry", f"@{q} on the entry point {node.name}")
                else:
                    self.add(d, "cross-call-state", f"@{q} on {node.name}")
        a = node.args
        positional = [*a.posonlyargs, *a.args]
        defaults = [
            *zip(positional[len(positional) - len(a.defaults) :], a.defaults),
            *zip(a.kwonlyargs, a.kw_defaults),
        ]
        for arg, default in defaults:
            if default is not None and is_container(default, self.aliases):
                self.module_containers.add(arg.arg)
                self.add(default, "cross-call-state", f"mutable default argument {arg.arg} of {node.name}")
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.add(node, "tensor-subclass", f"defines {node.name}")
        self._func_depth += 1
        self.keys.enter()
        self.generic_visit(node)
        self.keys.leave()
        self._func_depth -= 1

    visit_FunctionDef = _visit_func
    visit_AsyncFunctionDef = _visit_func

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            q = self.qualname(b)
            if q in TENSOR_BASES or (q and q.startswith("torch.") and q.endswith("Tensor")):
                self.add(node, "tensor-subclass", f"class {node.name} subclasses {q}")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.add(node, "cross-call-state", f"global {', '.join(node.names)}")
        self.generic_visit(node)

    # -- names and attributes ---------------------------------------------------
    def _check_name_use(self, node: ast.AST, qual: str) -> None:
        if qual in INTROSPECTION_CALLS:
            self.add(node, "caller-introspection", f"uses {qual}")
        elif qual in RAW_FD_CALLS:
            self.add(node, "raw-fd", f"uses {qual}")
        elif starts(qual, PROCESS_CALLS_PREFIX) or any(qual.startswith(p) for p in PROCESS_CALLS_PREFIX):
            self.add(node, "thread-or-process", f"uses {qual}")
        elif qual in SIDE_STREAM_CALLS:
            self.add(node, "side-stream", f"uses {qual}")
        elif in_modules(qual, ("sys.modules",)):
            self.add(node, "harness-patch", f"uses {qual}")
        elif qual in ("os.environ", "os.environb") or qual in ENV_CALLS:
            self.add(node, "env-read", f"uses {qual}")
        self._check_environment_use(node, qual)
        hit = foreign_code.check_loader_name(qual)
        if hit:
            self.add(node, *hit)

    def _check_environment_use(self, node: ast.AST, qual: str) -> None:
        if environment.is_sniff_name(qual):
            self.add(node, "env-sniff", f"uses {qual}")
        elif (
            in_modules(qual, _ENVIRON_ROOTS)
            and id(node) not in self._named_env_reads
            and not isinstance(node, ast.ImportFrom)
        ):
            self.add(node, "env-read", f"uses {qual}")
            self.add(node, "env-sniff", f"reads the environment through {qual} without one constant variable name")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in INTROSPECTION_ATTRS:
            self.add(node, "caller-introspection", f"reads .{node.attr}")
        qual = self.qualname(node)
        if qual and self.imported_root(node):
            self._check_name_use(node, qual)
            return  # the chain's inner attributes name the same thing: do not re-check them
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        target = self.aliases.get(node.id)
        if target is not None:
            self._check_name_use(node, target)
        elif node.id == "__builtins__":
            self.add(node, "harness-patch", "uses __builtins__")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and id(node) not in self._docstrings:
            hit = environment.string_tell(node.value)
            if hit:
                self.add(node, *hit)

    # -- the environment read by one name ----------------------------------------
    def _named_env_read(self, node: ast.AST, environ_node: ast.AST, name_node: ast.AST | None) -> None:
        """`os.getenv("X")`, `os.environ["X"]`, `"X" in os.environ`: warn, or fail when X is a tell."""
        name = _env_name(name_node) if name_node is not None else None
        if name is None:
            self.add(node, "env-sniff", "reads an environment variable by a computed name")
            return
        self._named_env_reads.add(id(environ_node))
        if environment.env_var_tell(name):
            self.add(node, "env-sniff", f"reads the environment variable {name}")

    def _check_env_call(self, node: ast.Call, q: str) -> None:
        first = node.args[0] if node.args else None
        if q in ENV_GET_CALLS:
            self._named_env_read(node, node.func, first)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _ENV_NAMED_METHODS:
            base = self.qualname(node.func.value)
            if base in ENVIRON_NAMES:
                self._named_env_read(node, node.func, first)
                self._named_env_reads.add(id(node.func.value))

    # -- calls --------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        q = self.qualname(node.func)
        leaf = call_leaf(node)
        if q in DYNAMIC_CALLS or (q and q.split(".")[-1] in ("exec", "eval") and q.startswith("builtins")):
            self.add(node, "dynamic-code", f"calls {q}")
        elif q in SETATTR_CALLS and node.args:
            obj = node.args[0]
            oq = self.qualname(obj)
            attr = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "?"
            if oq and self.imported_root(obj):
                self._classify_patch(node, f"{oq}.{attr}")
            elif attr in PRECISION_FLAGS:
                self.add(node, "precision-downgrade", f"sets {attr}")
        elif q in ("vars", "globals") and node.args and self.imported_root(node.args[0]):
            self.add(node, "harness-patch", f"{q}() of module {self.qualname(node.args[0])}")
        elif q in PRECISION_CALLS:
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) and arg.value == "highest"):
                self.add(node, "precision-downgrade", f"calls {q}")
        elif q in GRAPH_CALLS:
            self.add(node, "cuda-graph", f"uses {q}")
        elif q in FILE_CALLS or (leaf in PATH_IO_METHODS and q and "Path" in q):
            self._check_open(node, q or leaf)
        elif leaf in FILE_WRITE_METHODS:
            self.add(node, "file-access", f"calls .{leaf}()")
        if leaf == "data_ptr":
            self.add(node, "data-ptr", "calls .data_ptr()")
        if q:
            self._check_env_call(node, q)
            hit = foreign_code.check_call(node, q, self.languages)
            if hit:
                self.add(node, *hit)
        if leaf in _STRING_PROBES and isinstance(node.func, ast.Attribute) and _mentions_file(node.func.value):
            self.add(node, "env-sniff", f"probes its own path with __file__.{leaf}()")
        self._check_cast(node, leaf)
        self._check_cache_lookup(node)
        self.generic_visit(node)

    def _check_open(self, node: ast.Call, q: str) -> None:
        path = node.args[0] if node.args else None
        if isinstance(path, ast.Constant) and isinstance(path.value, str) and path.value.startswith(FD_PATH_PREFIXES):
            self.add(node, "raw-fd", f"opens {path.value}")
            return
        if isinstance(path, ast.JoinedStr) and any(
            isinstance(v, ast.Constant) and any(p in str(v.value) for p in FD_PATH_PREFIXES) for v in path.values
        ):
            self.add(node, "raw-fd", "opens a /proc or /dev/fd path")
            return
        self.add(node, "file-access", f"calls {q}")

    def _is_low_float(self, node: ast.AST) -> bool:
        q = self.qualname(node)
        if (
            q is not None
            and q.split(".")[-1] in LOW_FLOATS
            and q.split(".")[0] in LOW_FLOAT_ROOTS | self.aliases.roots()
        ):
            return True
        return isinstance(node, ast.Constant) and node.value in LOW_FLOAT_NAMES

    def _check_cast(self, node: ast.Call, leaf: str) -> None:
        if leaf in LOW_CAST_METHODS and isinstance(node.func, ast.Attribute) and not node.args:
            self.add(node, "low-precision-cast", f".{leaf}()")
            return
        if leaf in CAST_METHODS and isinstance(node.func, ast.Attribute):
            for a in [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]:
                if self._is_low_float(a):
                    self.add(node, "low-precision-cast", f".{leaf}({ast.unparse(a)})")
                    return
            return
        for k in node.keywords:
            if k.arg == "dtype" and self._is_low_float(k.value):
                self.add(node, "low-precision-cast", f"allocates with dtype={ast.unparse(k.value)}")
                return

    # -- caches ---------------------------------------------------------------------
    def _cache_use(self, node: ast.AST, container: str, how: str, key: ast.AST) -> None:
        kind = self.keys.kind(key)
        if kind:
            self.add(node, kind[0], f"{how} {container} keyed on {kind[1]}")

    def _check_cache_lookup(self, node: ast.Call) -> None:
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in CONTAINER_METHODS
            and isinstance(f.value, ast.Name)
            and f.value.id in self.module_containers
            and node.args
        ):
            self._cache_use(node, f.value.id, f".{f.attr} on cross-call container", node.args[0])

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.module_containers and self._func_depth > 0:
            self._cache_use(node, node.value.id, "indexes cross-call container", node.slice)
        if self.qualname(node.value) in ENVIRON_NAMES:
            self._named_env_read(node, node.value, node.slice)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            for comp in node.comparators:
                if isinstance(comp, ast.Name) and comp.id in self.module_containers:
                    self._cache_use(node, comp.id, "membership test in cross-call container", node.left)
                if self.qualname(comp) in ENVIRON_NAMES:
                    self._named_env_read(node, comp, node.left)
        if _mentions_file(node):
            self.add(node, "env-sniff", "compares its own path (__file__) with something")
        self.generic_visit(node)


def scan_source(
    path: str, source: str, entry_function: str | None = None, languages: Sequence[Language] = ("pytorch",)
) -> list[Finding]:
    """Findings for one file of a solution in `languages`; a file that is not Python gets one 'unparsed' warning,
    a shipped binary fails."""
    if isinstance(languages, str):  # a bare string is a sequence of letters: no language would ever match
        raise TypeError(f"languages must be a list of language names, not the string {languages!r}")
    if not path.endswith(".py"):
        if foreign_code.shipped_binary(path):
            rule = RULES["foreign-code"]
            return [
                Finding(
                    file=path,
                    line=0,
                    rule=rule.id,
                    severity=rule.severity,
                    message=f"{path}: ships a compiled or serialised file: {rule.why}",
                )
            ]
        return [
            Finding(file=path, line=0, rule="unparsed", severity="warn", message=f"{path}: {RULES['unparsed'].why}")
        ]
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return [
            Finding(
                file=path,
                line=e.lineno or 0,
                rule="dynamic-code",
                severity="fail",
                message=f"syntax error ({e.msg}): the file cannot be scanned",
            )
        ]
    scanner = _Scanner(path, entry_function, languages, tree)
    scanner.visit(tree)
    return sorted(scanner.findings, key=lambda f: (f.line, f.rule))


def scan_solution(solution: Solution) -> list[Finding]:
    """Every source, by the very path the sandbox writes it to (worker.sandbox.runner sends `src.path` as is).

    The model only holds canonical, distinct paths; one that is not (a model built without validation) or that
    two sources share would let the scan read one file and the sandbox write another over it, so it fails here."""
    out: list[Finding] = []
    seen: set[str] = set()
    for src in solution.sources:
        try:
            check_source_path(src.path)
        except ValueError as err:
            out.append(_alias_finding(src.path, str(err)))
            continue
        if src.path in seen:
            out.append(_alias_finding(src.path, "is given twice: the sandbox would write one copy over the other"))
            continue
        seen.add(src.path)
        entry = solution.spec.entry_function if src.path == solution.spec.entry_file else None
        out.extend(scan_source(src.path, src.content, entry, solution.spec.languages))
    return out


def _alias_finding(path: str, reason: str) -> Finding:
    rule = RULES["path-alias"]
    return Finding(
        file=path[:200],
        line=0,
        rule=rule.id,
        severity=rule.severity,
        message=f"source path {path[:200]!r} {reason}: {rule.why}",
    )
