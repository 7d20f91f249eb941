"""The AST scanner behind the static stage: walks each Python source with import aliases resolved
(`import time as t; t.perf_counter = f` is `time.perf_counter` patched), so renaming does not fool it."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from worker.formats import Solution
from worker.static.rules import RULES, Finding

# --- what each rule looks for -------------------------------------------------

TIMER_PREFIXES = (
    "time.", "timeit.", "torch.cuda.Event", "torch.cuda.synchronize", "torch.cuda.current_stream",
    "torch.cuda.default_stream", "torch.cuda.Stream", "torch.cuda.elapsed_time", "torch.Event", "torch.cuda.nvtx",
    "triton.testing.", "torch.utils.benchmark.", "torch.profiler.", "triton.runtime.driver",
)
CHECKER_PREFIXES = (
    "torch.allclose", "torch.isclose", "torch.equal", "torch.testing.", "torch.Tensor.", "torch.eq",
    "torch.abs", "torch.isfinite", "torch.isnan", "torch.all", "torch.any", "torch.sum", "torch.max",
    "torch.load", "torch.save", "numpy.", "torch.nn.functional.", "torch.Generator", "torch.manual_seed",
    "torch.randn", "torch.randint", "torch.rand",
)
HARNESS_ROOTS = ("worker", "kaudit", "sol_execbench", "flashinfer_bench", "__main__")
PATCH_FREE_PREFIXES = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.", "triton.config.")

THREAD_MODULES = ("threading", "_thread", "multiprocessing", "concurrent", "subprocess", "torch.multiprocessing", "pty")
NETWORK_MODULES = (
    "socket", "urllib", "urllib3", "requests", "http", "httpx", "aiohttp", "ftplib", "smtplib", "ssl",
    "websocket", "websockets", "xmlrpc", "paramiko", "telnetlib", "socketserver", "asyncio.streams",
)
PATCH_MODULES = ("unittest.mock", "mock")
RAW_MEMORY_MODULES = ("ctypes", "mmap", "cffi")
INTROSPECTION_CALLS = {
    "inspect.stack", "inspect.currentframe", "inspect.getouterframes", "inspect.getinnerframes", "inspect.trace",
    "inspect.getframeinfo", "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
    "threading.settrace", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "traceback.extract_stack", "traceback.walk_stack", "traceback.format_stack", "traceback.print_stack",
}
INTROSPECTION_ATTRS = {"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "__subclasses__"}
PROCESS_CALLS_PREFIX = ("os.fork", "os.forkpty", "os.system", "os.popen", "os.spawn", "os.exec", "os.posix_spawn", "os.kill", "os.killpg")
RAW_FD_CALLS = {"os._exit", "os.write", "os.writev", "os.dup", "os.dup2", "os.fdopen", "os.pipe", "os.open", "os.close", "os.closerange", "os.sendfile", "os.pwrite"}
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module", "importlib.reload", "importlib.__import__", "runpy.run_path", "runpy.run_module", "builtins.exec", "builtins.eval"}
SIDE_STREAM_CALLS = {
    "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
    "torch.cuda.StreamContext", "torch.Stream", "torch.cuda.streams.Stream", "torch.cuda.streams.ExternalStream",
}
GRAPH_CALLS = {"torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.make_graphed_callables"}
MEMO_DECORATORS = {"functools.lru_cache", "functools.cache", "functools.cached_property"}
LOW_FLOATS = {"float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8e4nv", "float8e5", "fp8e4nv", "fp8e5"}
LOW_CAST_METHODS = {"half", "bfloat16"}
PRECISION_FLAGS = {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction", "fp32_precision"}
PRECISION_CALLS = {"torch.set_float32_matmul_precision", "torch.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast"}
ENV_CALLS = {"os.getenv", "os.environ.get", "os.getenvb", "os.environ.copy", "os.environ.items", "os.environ.keys"}
FILE_CALLS = {"open", "io.open", "os.listdir", "os.scandir", "shutil.copy", "shutil.copyfile", "tempfile.NamedTemporaryFile"}
IDENTITY_KEY_CALLS = {"data_ptr", "id", "hash", "untyped_storage", "storage", "storage_offset"}
IDENTITY_KEY_ATTRS = {"_cdata"}
SHAPE_KEY_CALLS = {"size", "stride", "dim", "numel"}
SHAPE_KEY_ATTRS = {"shape", "ndim"}
CONTAINER_CTORS = {"dict", "list", "set", "collections.OrderedDict", "collections.defaultdict", "weakref.WeakKeyDictionary", "weakref.WeakValueDictionary", "OrderedDict", "defaultdict"}


def _starts(name: str, prefixes: tuple[str, ...]) -> bool:
    """`name` is one of the prefixes ("a.b") or inside one ("a.b.c"); a prefix ending in "." matches only inside."""
    for p in prefixes:
        if p.endswith("."):
            if name.startswith(p) or name == p[:-1]:
                return True
        elif name == p or name.startswith(p + "."):
            return True
    return False


def _in_modules(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


@dataclass
class _Scanner(ast.NodeVisitor):
    file: str
    entry_function: str | None
    findings: list[Finding] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    module_containers: set[str] = field(default_factory=set)
    # per function: local names holding a value built from identities or shapes (key = x.data_ptr(); _C[key])
    _key_names: list[dict[str, tuple[str, str]]] = field(default_factory=list)
    _func_depth: int = 0

    # -- helpers -----------------------------------------------------------
    def add(self, node: ast.AST, rule: str, detail: str) -> None:
        r = RULES[rule]
        line = getattr(node, "lineno", 0)
        if any(f.line == line and f.rule == rule for f in self.findings):
            return
        self.findings.append(Finding(file=self.file, line=line, rule=rule, severity=r.severity, message=f"{detail}: {r.why}"))

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
        root = self.aliases.get(node.id, node.id)
        return ".".join([root, *reversed(parts)])

    def imported_root(self, node: ast.AST) -> bool:
        """The expression's root name was bound by an import (or is an alias of a module)."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.aliases

    # -- imports -----------------------------------------------------------
    def _check_module(self, node: ast.AST, module: str) -> None:
        if _in_modules(module, THREAD_MODULES):
            self.add(node, "thread-or-process", f"imports {module}")
        elif _in_modules(module, NETWORK_MODULES):
            self.add(node, "network", f"imports {module}")
        elif _in_modules(module, HARNESS_ROOTS):
            self.add(node, "harness-patch", f"imports the harness module {module}")
        elif _in_modules(module, PATCH_MODULES):
            self.add(node, "monkeypatch", f"imports {module}")
        elif _in_modules(module, RAW_MEMORY_MODULES):
            self.add(node, "raw-memory", f"imports {module}")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(node, a.name)
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                root = a.name.split(".")[0]
                self.aliases[root] = root
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = ("." * node.level) + (node.module or "")
        if node.level == 0 and node.module:
            self._check_module(node, node.module)
        for a in node.names:
            full = f"{node.module}.{a.name}" if node.module else a.name
            if node.level == 0:
                self._check_module(node, full)
                self._check_name_use(node, full)
            self.aliases[a.asname or a.name] = full if node.level == 0 else f"{module}.{a.name}"
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
            elif target.attr in ("__class__", "__dict__", "__code__", "__globals__"):
                self.add(target, "monkeypatch", f"rebinds .{target.attr}")
        elif isinstance(target, ast.Subscript):
            base = self.qualname(target.value)
            if base in ("sys.modules", "builtins.__dict__", "__builtins__") or (base or "").endswith(".__dict__"):
                self.add(target, "harness-patch", f"writes into {base}")
            elif base and base.startswith("os.environ"):
                self.add(target, "env-read", "writes os.environ")
        elif isinstance(target, ast.Name):
            if value is not None and self._func_depth == 0 and self._is_container(value):
                self.module_containers.add(target.id)
            if value is not None and self._key_names:
                kind = self._key_kind(value)
                if kind:
                    self._key_names[-1][target.id] = kind
                else:
                    self._key_names[-1].pop(target.id, None)
            if value is not None:
                q = self.qualname(value)
                if q and isinstance(value, (ast.Name, ast.Attribute)) and self.imported_root(value):
                    self.aliases[target.id] = q  # t = time: t is time from here on
            if target.id == "__builtins__":
                self.add(target, "harness-patch", "rebinds __builtins__")

    def _classify_patch(self, node: ast.AST, qual: str) -> None:
        leaf = qual.rsplit(".", 1)[-1]
        if _starts(qual, PATCH_FREE_PREFIXES) or qual.endswith(".config") or ".config." in qual:
            if leaf in PRECISION_FLAGS:
                self.add(node, "precision-downgrade", f"sets {qual}")
            return
        if _starts(qual, TIMER_PREFIXES):
            self.add(node, "timer-monkeypatch", f"assigns to {qual}")
        elif _starts(qual, CHECKER_PREFIXES):
            self.add(node, "checker-monkeypatch", f"assigns to {qual}")
        elif _in_modules(qual, HARNESS_ROOTS) or qual.startswith("sys.") or qual.startswith("builtins."):
            self.add(node, "harness-patch", f"assigns to {qual}")
        else:
            self.add(node, "monkeypatch", f"assigns to {qual}")

    def _is_container(self, value: ast.AST) -> bool:
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp)):
            return True
        if isinstance(value, ast.Call):
            q = self.qualname(value.func)
            return q in CONTAINER_CTORS
        return False

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
            target = d.func if isinstance(d, ast.Call) else d
            q = self.qualname(target)
            if q in MEMO_DECORATORS or q in ("lru_cache", "cache"):
                if self._func_depth == 0 and node.name == self.entry_function:
                    self.add(d, "memoized-entry", f"@{q} on the entry point {node.name}")
                else:
                    self.add(d, "cross-call-state", f"@{q} on {node.name}")
        a = node.args
        positional = [*a.posonlyargs, *a.args]
        for arg, default in zip(positional[len(positional) - len(a.defaults):], a.defaults):
            if self._is_container(default):
                self.module_containers.add(arg.arg)
                self.add(default, "cross-call-state", f"mutable default argument {arg.arg} of {node.name}")
        for arg, default in zip(a.kwonlyargs, a.kw_defaults):
            if default is not None and self._is_container(default):
                self.module_containers.add(arg.arg)
                self.add(default, "cross-call-state", f"mutable default argument {arg.arg} of {node.name}")
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.add(node, "tensor-subclass", f"defines {node.name}")
        self._func_depth += 1
        self._key_names.append({})
        self.generic_visit(node)
        self._key_names.pop()
        self._func_depth -= 1

    visit_FunctionDef = _visit_func
    visit_AsyncFunctionDef = _visit_func

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            q = self.qualname(b)
            if q in ("torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter") or (
                q and q.startswith("torch.") and q.endswith("Tensor")
            ):
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
        elif _starts(qual, PROCESS_CALLS_PREFIX) or any(qual.startswith(p) for p in PROCESS_CALLS_PREFIX):
            self.add(node, "thread-or-process", f"uses {qual}")
        elif qual in SIDE_STREAM_CALLS:
            self.add(node, "side-stream", f"uses {qual}")
        elif qual == "sys.modules":
            self.add(node, "harness-patch", "uses sys.modules")
        elif qual in ("os.environ", "os.environb") or qual in ENV_CALLS:
            self.add(node, "env-read", f"uses {qual}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in INTROSPECTION_ATTRS:
            self.add(node, "caller-introspection", f"reads .{node.attr}")
        qual = self.qualname(node)
        if qual and self.imported_root(node):
            self._check_name_use(node, qual)
            return  # the chain's inner attributes name the same thing: do not re-check them
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases:
            self._check_name_use(node, self.aliases[node.id])
        elif node.id == "__builtins__":
            self.add(node, "harness-patch", "uses __builtins__")

    # -- calls --------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        q = self.qualname(node.func)
        leaf = node.func.attr if isinstance(node.func, ast.Attribute) else (node.func.id if isinstance(node.func, ast.Name) else "")
        if q in DYNAMIC_CALLS or (q and q.split(".")[-1] in ("exec", "eval") and q.startswith("builtins")):
            self.add(node, "dynamic-code", f"calls {q}")
        elif q in ("setattr", "builtins.setattr", "delattr", "object.__setattr__") and node.args:
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
        elif q in FILE_CALLS or (leaf in ("write_text", "write_bytes", "read_text", "read_bytes") and q and "Path" in q):
            self._check_open(node, q or leaf)
        elif leaf in ("write_text", "write_bytes", "unlink", "touch"):
            self.add(node, "file-access", f"calls .{leaf}()")
        if leaf == "data_ptr":
            self.add(node, "data-ptr", "calls .data_ptr()")
        self._check_cast(node, leaf)
        self._check_cache_lookup(node)
        self.generic_visit(node)

    def _check_open(self, node: ast.Call, q: str) -> None:
        path = node.args[0] if node.args else None
        if isinstance(path, ast.Constant) and isinstance(path.value, str) and path.value.startswith(("/proc", "/dev/fd")):
            self.add(node, "raw-fd", f"opens {path.value}")
            return
        if isinstance(path, ast.JoinedStr) and any(
            isinstance(v, ast.Constant) and "/proc" in str(v.value) or isinstance(v, ast.Constant) and "/dev/fd" in str(v.value)
            for v in path.values
        ):
            self.add(node, "raw-fd", "opens a /proc or /dev/fd path")
            return
        self.add(node, "file-access", f"calls {q}")

    def _is_low_float(self, node: ast.AST) -> bool:
        q = self.qualname(node)
        if q is not None and q.split(".")[-1] in LOW_FLOATS and q.split(".")[0] in {"torch", "triton", "tl", "numpy", "np"} | {
            v.split(".")[0] for v in self.aliases.values()
        }:
            return True
        return isinstance(node, ast.Constant) and node.value in ("float16", "bfloat16", "half")

    def _check_cast(self, node: ast.Call, leaf: str) -> None:
        if leaf in LOW_CAST_METHODS and isinstance(node.func, ast.Attribute) and not node.args:
            self.add(node, "low-precision-cast", f".{leaf}()")
            return
        if leaf in ("to", "type", "view", "astype") and isinstance(node.func, ast.Attribute):
            for a in [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]:
                if self._is_low_float(a):
                    self.add(node, "low-precision-cast", f".{leaf}({ast.unparse(a)})")
                    return
            return
        for k in node.keywords:
            if k.arg == "dtype" and self._is_low_float(k.value):
                self.add(node, "low-precision-cast", f"allocates with dtype={ast.unparse(k.value)}")
                return

    def _key_kind(self, expr: ast.AST) -> tuple[str, str] | None:
        """(rule, what) when a cache key is built from object identity (fail) or shapes (warn)."""
        shape: str | None = None
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and self._key_names and n.id in self._key_names[-1]:
                rule, what = self._key_names[-1][n.id]
                if rule == "output-cache":
                    return rule, f"{what} (via {n.id})"
                shape = shape or f"{what} (via {n.id})"
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
                if name in IDENTITY_KEY_CALLS:
                    return "output-cache", f"{name}()"
                if name in SHAPE_KEY_CALLS:
                    shape = shape or f"{name}()"
            if isinstance(n, ast.Attribute):
                if n.attr in IDENTITY_KEY_ATTRS:
                    return "output-cache", f".{n.attr}"
                if n.attr in SHAPE_KEY_ATTRS:
                    shape = shape or f".{n.attr}"
        return ("shape-keyed-cache", shape) if shape else None

    def _cache_use(self, node: ast.AST, container: str, how: str, key: ast.AST) -> None:
        kind = self._key_kind(key)
        if kind:
            self.add(node, kind[0], f"{how} {container} keyed on {kind[1]}")

    def _check_cache_lookup(self, node: ast.Call) -> None:
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("get", "setdefault", "pop", "__getitem__", "__setitem__", "__contains__")
            and isinstance(f.value, ast.Name)
            and f.value.id in self.module_containers
            and node.args
        ):
            self._cache_use(node, f.value.id, f".{f.attr} on cross-call container", node.args[0])

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.module_containers and self._func_depth > 0:
            self._cache_use(node, node.value.id, "indexes cross-call container", node.slice)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            for comp in node.comparators:
                if isinstance(comp, ast.Name) and comp.id in self.module_containers:
                    self._cache_use(node, comp.id, "membership test in cross-call container", node.left)
        self.generic_visit(node)


def _prescan_containers(tree: ast.Module, scanner: _Scanner) -> None:
    """Module-level containers are known before the functions that use them are visited."""
    for n in tree.body:
        if isinstance(n, ast.Import):
            for a in n.names:
                scanner.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            for a in n.names:
                scanner.aliases[a.asname or a.name] = f"{n.module}.{a.name}"
    for n in tree.body:
        value = n.value if isinstance(n, (ast.Assign, ast.AnnAssign)) else None
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if value is not None and scanner._is_container(value):
            scanner.module_containers.update(t.id for t in targets if isinstance(t, ast.Name))


def scan_source(path: str, source: str, entry_function: str | None = None) -> list[Finding]:
    """Findings for one file; a file that is not Python gets one 'unparsed' warning."""
    if not path.endswith(".py"):
        return [Finding(file=path, line=0, rule="unparsed", severity="warn", message=f"{path}: {RULES['unparsed'].why}")]
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return [Finding(file=path, line=e.lineno or 0, rule="dynamic-code", severity="fail", message=f"syntax error ({e.msg}): the file cannot be scanned")]
    scanner = _Scanner(file=path, entry_function=entry_function)
    _prescan_containers(tree, scanner)
    scanner.visit(tree)
    return sorted(scanner.findings, key=lambda f: (f.line, f.rule))


def scan_solution(solution: Solution) -> list[Finding]:
    out: list[Finding] = []
    for src in solution.sources:
        entry = solution.spec.entry_function if src.path == solution.spec.entry_file else None
        out.extend(scan_source(src.path, src.content, entry))
    return out
