"""The static stage: AST scan for cheat patterns, aliases resolved, legitimate kernels left alone;
kernelguard (PyPI) as a second rule source."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.formats import Language, Solution, SolutionSpec, SourceFile
from worker.stages import static
from worker.stages.result import StageStatus
from worker.static.kernelguard_rules import KERNELGUARD_VERSION, scan_solution_with_kernelguard
from worker.static.rules import RULES
from worker.static.scanner import scan_source

CATALOGUE = load_catalogue()
EXAMPLES = [(p.name, n, s) for p in CATALOGUE for n, s in p.example_solutions().items()]


def _rules(src: str, entry: str | None = "run", languages: list[Language] | None = None) -> dict[str, str]:
    return {f.rule: f.severity for f in scan_source("k.py", src, entry, languages or ["pytorch"])}


def _solution(sources: dict[str, str], languages: list[Language] | None = None, dps: bool = True) -> Solution:
    spec = SolutionSpec(
        languages=languages or ["pytorch"], entry_point=f"{next(iter(sources))}::run", destination_passing_style=dps
    )
    return Solution(
        name="s",
        definition="embedding_backward",
        spec=spec,
        sources=[SourceFile(path=p, content=c) for p, c in sources.items()],
    )


@pytest.mark.parametrize(("problem", "name", "solution"), EXAMPLES, ids=[f"{p}/{n}" for p, n, _ in EXAMPLES])
def test_every_catalogue_example_passes_static(problem: str, name: str, solution: Solution) -> None:
    ctx = AuditContext(problem=CATALOGUE.get(problem), solution=solution)
    result = static.run(ctx)
    assert result.status is StageStatus.passed, result.summary
    assert result.metrics["fail_findings"] == 0


# (source, rule that must be reported, its severity)
CHEATS = [
    ("import time\ntime.perf_counter = lambda: 0.0\n", "timer-monkeypatch", "fail"),
    ("import time as t\nt.perf_counter = lambda: 0.0\n", "timer-monkeypatch", "fail"),
    (
        "import time\nfrom time import perf_counter\nsetattr(time, 'perf_counter', perf_counter)\n",
        "timer-monkeypatch",
        "fail",
    ),
    ("import torch\nc = torch.cuda\nc.synchronize = lambda *a: None\n", "timer-monkeypatch", "fail"),
    ("import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 1e-3\n", "timer-monkeypatch", "fail"),
    ("from torch.cuda import Event\nEvent.record = lambda self: None\n", "timer-monkeypatch", "fail"),
    ("import triton.testing as tt\ntt.do_bench = lambda *a, **k: 1e-3\n", "timer-monkeypatch", "fail"),
    ("import torch\ntorch.allclose = lambda *a, **k: True\n", "checker-monkeypatch", "fail"),
    ("import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None\n", "checker-monkeypatch", "fail"),
    ("import torch\ntorch.Tensor.copy_ = lambda self, o: self\n", "checker-monkeypatch", "fail"),
    ("import worker.sandbox.child as c\n", "harness-patch", "fail"),
    ("import sys\nsys.modules['time'] = object()\n", "harness-patch", "fail"),
    ("from unittest import mock\n", "monkeypatch", "fail"),
    ("import threading\n", "thread-or-process", "fail"),
    ("from concurrent.futures import ThreadPoolExecutor\n", "thread-or-process", "fail"),
    ("import multiprocessing as mp\n", "thread-or-process", "fail"),
    ("import subprocess\n", "thread-or-process", "fail"),
    ("import os\ndef run():\n    os.fork()\n", "thread-or-process", "fail"),
    ("import torch\ndef run():\n    s = torch.cuda.Stream()\n", "side-stream", "fail"),
    ("import torch\ndef run(s):\n    with torch.cuda.stream(s):\n        pass\n", "side-stream", "fail"),
    ("import inspect\ndef run():\n    return inspect.stack()\n", "caller-introspection", "fail"),
    ("import sys\ndef run():\n    return sys._getframe(1)\n", "caller-introspection", "fail"),
    ("from sys import _getframe as g\ndef run():\n    return g(1)\n", "caller-introspection", "fail"),
    ("import gc\ndef run():\n    return gc.get_objects()\n", "caller-introspection", "fail"),
    ("def run(frame):\n    return frame.f_back.f_locals\n", "caller-introspection", "fail"),
    ("import socket\n", "network", "fail"),
    ("import urllib.request\n", "network", "fail"),
    ("import requests\n", "network", "fail"),
    ("import os, sys\ndef run():\n    os.write(int(sys.argv[2]), b'')\n", "raw-fd", "fail"),
    ("import os\ndef run():\n    os._exit(0)\n", "raw-fd", "fail"),
    ("def run():\n    open('/proc/self/fd/4', 'wb')\n", "raw-fd", "fail"),
    ("import ctypes\n", "raw-memory", "fail"),
    ("exec('x = 1')\n", "dynamic-code", "fail"),
    ("m = __import__('ti' + 'me')\n", "dynamic-code", "fail"),
    ("import torch\nclass Lazy(torch.Tensor):\n    pass\n", "tensor-subclass", "fail"),
    (
        "class T:\n    @classmethod\n    def __torch_function__(cls, f, t, a=(), k=None):\n        pass\n",
        "tensor-subclass",
        "fail",
    ),
    (
        "_C = {}\ndef run(x, out):\n    if x.data_ptr() in _C:\n        out.copy_(_C[x.data_ptr()])\n",
        "output-cache",
        "fail",
    ),
    ("_C = {}\ndef run(x, out):\n    key = (id(x), x.shape)\n    hit = _C.get(key)\n", "output-cache", "fail"),
    ("def run(x, out, _memo={}):\n    _memo[id(x)] = out\n", "output-cache", "fail"),
    ("import functools\n@functools.lru_cache(maxsize=None)\ndef run(x):\n    return x\n", "memoized-entry", "fail"),
    ("_C = {}\ndef run(x, out):\n    key = tuple(x.shape)\n    _C[key] = out.clone()\n", "shape-keyed-cache", "warn"),
    ("def run(x, out):\n    out.copy_(x.half())\n", "low-precision-cast", "warn"),
    ("import torch\ndef run(x, out):\n    out.copy_(x.to(torch.bfloat16))\n", "low-precision-cast", "warn"),
    ("import torch\ndef run(x, out):\n    acc = torch.zeros(4, dtype=torch.bfloat16)\n", "low-precision-cast", "warn"),
    ("import triton.language as tl\ndef k(x):\n    return x.to(tl.float8e4nv)\n", "low-precision-cast", "warn"),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", "precision-downgrade", "warn"),
    (
        "import torch\ntorch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True\n",
        "precision-downgrade",
        "warn",
    ),
    ("import torch\ntorch.set_float32_matmul_precision('medium')\n", "precision-downgrade", "warn"),
    ("def run(x, out):\n    return x.data_ptr()\n", "data-ptr", "warn"),
    ("done = False\ndef run(x, out):\n    global done\n    done = True\n", "cross-call-state", "warn"),
    ("def run(x, out):\n    open('/tmp/o.txt', 'w').write('x')\n", "file-access", "warn"),
    ("import os\ndef run(x, out):\n    return os.environ.get('BENCH')\n", "env-read", "warn"),
    ("import os\nMODE = os.getenv('BENCH')\n", "env-read", "warn"),
    # environment sniffing: the whole environment, a tell-tale variable, /proc, the parent, host, user, paths
    ("import os\nW = any('KAUDIT' in k for k in os.environ)\n", "env-sniff", "fail"),
    ("import os\nE = dict(os.environ)\n", "env-sniff", "fail"),
    ("import os\nE = os.environ.copy()\n", "env-sniff", "fail"),
    ("from os import environ\nE = list(environ.items())\n", "env-sniff", "fail"),
    ("import os\nW = os.getenv('KAUDIT_SANDBOX') is not None\n", "env-sniff", "fail"),
    ("import os\nW = 'PYTEST_CURRENT_TEST' in os.environ\n", "env-sniff", "fail"),
    ("import os\nW = os.environ['DATABASE_URL']\n", "env-sniff", "fail"),
    ("import os\ndef run(name):\n    return os.getenv(name)\n", "env-sniff", "fail"),
    ("import os\ndef run():\n    return open(f'/proc/{os.getppid()}/environ').read()\n", "env-sniff", "fail"),
    ("from pathlib import Path\nP = Path('/proc') / 'self' / 'cgroup'\n", "env-sniff", "fail"),
    ("import os\nP = os.path.join('/sys', 'fs', 'cgroup')\n", "env-sniff", "fail"),
    ("W = 'sandbox' in __file__\n", "env-sniff", "fail"),
    ("W = __file__.endswith('solution/kernel.py')\n", "env-sniff", "fail"),
    ("import os\nW = os.getcwd()\n", "env-sniff", "fail"),
    ("from pathlib import Path\nW = Path.cwd()\n", "env-sniff", "fail"),
    ("import platform\nW = platform.node()\n", "env-sniff", "fail"),
    ("import os\nW = os.getuid() == 0\n", "env-sniff", "fail"),
    ("from os import getppid\nW = getppid()\n", "env-sniff", "fail"),
    ("import sys\nW = 'benchmark' in sys.argv\n", "env-sniff", "fail"),
    ("import psutil\n", "env-sniff", "fail"),
    ("def run(name):\n    return name == 'kaudit-sandbox'\n", "env-sniff", "fail"),
    # the service's broker and database
    ("import redis\n", "network", "fail"),
    ("from psycopg import connect\n", "network", "fail"),
    ("import celery\n", "network", "fail"),
    # Python's installation: site, pip, a .pth, site-packages, the harness through sys.modules
    ("import site\n", "harness-patch", "fail"),
    ("import pip\n", "harness-patch", "fail"),
    ("def run():\n    open('/x/zz.pth', 'w')\n", "harness-patch", "fail"),
    ("P = '/venv/lib/python3.11/site-packages/x.py'\n", "harness-patch", "fail"),
    ("import sys\nM = sys.modules.get('worker.sandbox.child')\n", "harness-patch", "fail"),
    ("import app.core.settings\n", "harness-patch", "fail"),
    # code that is not the scanned Python
    ("from pathlib import Path\nexec(Path('k.txt').read_text())\n", "foreign-code", "fail"),
    ("import base64\nexec(base64.b64decode('eD0x'))\n", "foreign-code", "fail"),
    ("import importlib.util\ns = importlib.util.spec_from_file_location('h', 'h.txt')\n", "foreign-code", "fail"),
    ("from importlib.machinery import SourceFileLoader\nm = SourceFileLoader('h', 'h.json')\n", "foreign-code", "fail"),
    ("import ctypes\nL = ctypes.CDLL('./libfast.so')\n", "foreign-code", "fail"),
    ("from ctypes import cdll\nL = cdll.LoadLibrary('libk.so')\n", "foreign-code", "fail"),
    ("import pickle\nC = pickle.loads(b'')\n", "foreign-code", "fail"),
    ("import marshal\nC = marshal.loads(b'')\n", "foreign-code", "fail"),
    ("import torch\nW = torch.load('w.pt', weights_only=False)\n", "foreign-code", "fail"),
    ("import numpy as np\nW = np.load('w.npy', allow_pickle=True)\n", "foreign-code", "fail"),
    ("import torch\ntorch.ops.load_library('libops.so')\n", "foreign-code", "fail"),
    ("import torch\nm = torch.jit.load('m.pt')\n", "foreign-code", "fail"),
    ("import sys\nsys.path.insert(0, '/tmp/elsewhere')\n", "foreign-code", "fail"),
    (
        "from torch.utils.cpp_extension import load_inline\nm = load_inline('k', cpp_sources='int f();')\n",
        "foreign-code",
        "fail",
    ),
    # a cache keyed on a few sampled input values (issue 9: "11.5x faster")
    (
        "_C = {}\ndef run(x, out):\n    key = tuple(x[:4].tolist())\n    hit = _C.get(key)\n",
        "value-keyed-cache",
        "fail",
    ),
    (
        "_C = {}\ndef run(x, out):\n    if x[0].item() in _C:\n        out.copy_(_C[x[0].item()])\n",
        "value-keyed-cache",
        "fail",
    ),
    # keys built in a helper function
    (
        "_C = {}\ndef _k(x):\n    return tuple(x[:4].tolist())\ndef run(x, out):\n    if _k(x) in _C:\n        out.copy_(_C[_k(x)])\n",
        "value-keyed-cache",
        "fail",
    ),
    (
        "_C = {}\ndef _k(x):\n    p = x.data_ptr()\n    return (p, 1)\ndef run(x, out):\n    _C[_k(x)] = out\n",
        "output-cache",
        "fail",
    ),
    ("import os\ndef run():\n    return os.environ.get('CUDA_VISIBLE_DEVICES')\n", "env-read", "warn"),
]


@pytest.mark.parametrize(("src", "rule", "severity"), CHEATS, ids=[f"{r}-{i}" for i, (_, r, _s) in enumerate(CHEATS)])
def test_cheat_pattern_is_reported(src: str, rule: str, severity: str) -> None:
    found = _rules(src)
    assert rule in found, f"{rule} not reported; got {found}"
    assert found[rule] == severity == RULES[rule].severity


BENIGN = [
    # the ordinary end-of-kernel store and dtype-following casts
    "import torch\ndef run(i, g, n, p, out):\n    acc = torch.zeros(out.shape, dtype=torch.float32)\n    acc.index_add_(0, i, g.float())\n    out.copy_(acc)\n",
    "def run(x, grad):\n    return x.to(grad.dtype)\n",
    "import triton.language as tl\ndef k(p, x):\n    tl.store(p, x.to(p.dtype.element_ty))\n    return x.to(tl.float32)\n",
    # reading flags, synchronising, cudnn autotune, numbers from os.path
    "import torch\ntorch.backends.cudnn.benchmark = True\nok = torch.backends.cuda.matmul.allow_tf32\n",
    "import torch\ndef run(x):\n    torch.cuda.synchronize()\n",
    "import os\nHERE = os.path.dirname(__file__)\n",
    "import torch\ntorch.set_float32_matmul_precision('highest')\n",
    # a local dict keyed on a pointer lives for one call only
    "def run(x, out):\n    seen = {}\n    seen[id(x)] = 1\n",
    # a module-level config table keyed on ints
    "_CFG = {}\ndef cfg(n: int):\n    if n not in _CFG:\n        _CFG[n] = n * 2\n    return _CFG[n]\n",
    # torch.compile and re.compile are not exec
    "import re, torch\nP = re.compile('x')\nf = torch.compile(lambda x: x)\n",
    # local variables named like modules are not modules
    "def run(time, out):\n    time.perf_counter = 1\n",
    # a device setting read by name, a sibling file found through __file__, prose in a docstring
    "import os\nDEV = os.environ.get('CUDA_VISIBLE_DEVICES', '0')\nLB = os.getenv('TRITON_INTERPRET')\n",
    "import os\nSRC = os.path.join(os.path.dirname(__file__), 'kernel.cu')\n",
    '"""Runs in the audit sandbox; reads no /proc, unlike a cheat."""\ndef run(x, out):\n    """No sandbox tricks."""\n    out.copy_(x)\n',
    # safe loaders, a local config table keyed on an int, a workspace keyed on a shape
    "import torch\nW = torch.load('w.pt', weights_only=True)\n",
    "_WS = {}\ndef run(x, out):\n    n = x.shape[0]\n    if n not in _WS:\n        _WS[n] = x.new_empty(n)\n",
]


@pytest.mark.parametrize("src", BENIGN)
def test_benign_code_has_no_fail_findings(src: str) -> None:
    fails = [f for f in scan_source("k.py", src, "run") if f.severity == "fail"]
    assert fails == []


def test_findings_name_file_line_and_rule() -> None:
    src = "import torch\n\n\ndef run(x, out):\n    out.copy_(x)\n\n\ntorch.allclose = lambda *a, **k: True\n"
    (f,) = scan_source("pkg/kernel.py", src, "run")
    assert (f.file, f.line, f.rule, f.severity) == ("pkg/kernel.py", 8, "checker-monkeypatch", "fail")
    assert "torch.allclose" in f.message


def test_stage_fails_on_any_fail_rule_and_reports_warnings() -> None:
    problem = CATALOGUE.get("embedding_backward")
    spec = SolutionSpec(languages=["pytorch"], entry_point="kernel.py::run")
    helper = "import torch\n\ndef cast(x):\n    return x.bfloat16()\n"
    bad = "import time\nfrom helper import cast\n\ndef run(i, g, n, p, out):\n    out.copy_(cast(g))\n\ntime.time = lambda: 0.0\n"
    sol = Solution(
        name="two_files",
        definition=problem.name,
        spec=spec,
        sources=[SourceFile(path="kernel.py", content=bad), SourceFile(path="helper.py", content=helper)],
    )
    result = static.run(AuditContext(problem=problem, solution=sol))
    assert result.status is StageStatus.failed
    assert result.summary.startswith("kernel.py:7 [timer-monkeypatch]")
    # ours names the line; kernelguard agrees (TIMER_MONKEYPATCH), for the whole file
    assert result.metrics["fail_rules"] == ["timer-monkeypatch", "kernelguard"]
    assert result.metrics["warn_rules"] == ["low-precision-cast"]
    assert result.evidence["rule_sources"]["kernelguard"] == KERNELGUARD_VERSION
    files = {f["file"] for f in result.evidence["findings"]}
    assert files == {"kernel.py", "helper.py"}

    good = sol.model_copy(
        update={
            "sources": [
                SourceFile(path="kernel.py", content=bad.replace("time.time = lambda: 0.0\n", "")),
                sol.sources[1],
            ]
        }
    )
    result = static.run(AuditContext(problem=problem, solution=good))
    assert result.status is StageStatus.passed
    assert "1 warning(s): low-precision-cast" in result.summary


def test_unparseable_python_fails_and_other_files_warn() -> None:
    assert _rules("def run(:\n") == {"dynamic-code": "fail"}
    (f,) = scan_source("kernel.cu", "__global__ void k() {}", None)
    assert (f.rule, f.severity) == ("unparsed", "warn")


def test_native_builds_warn_for_cuda_and_cpp_solutions_and_fail_elsewhere() -> None:
    src = "from torch.utils.cpp_extension import load_inline\nm = load_inline('k', cpp_sources='int f();', cuda_sources='')\n"
    for cpp in ("cuda_cpp", "cutlass", "cudnn", "cublas"):
        assert _rules(src, languages=[cpp]) == {"native-extension": "warn"}
    for python in ("pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend"):
        assert _rules(src, languages=[python]) == {"foreign-code": "fail"}, python
    with pytest.raises(TypeError, match="not the string"):  # a bare string would match no language at all
        scan_source("k.py", src, None, "cuda_cpp")  # type: ignore[arg-type]
    fed_data = "import torch.utils.cpp_extension as ext\nm = ext.load('k', sources=['kernel.cu', 'blob.txt'])\n"
    assert _rules(fed_data, languages=["cuda_cpp"])["foreign-code"] == "fail"


def test_shipped_binaries_fail_and_text_sources_only_warn() -> None:
    for name in ("libfast.so", "kernel.cubin", "weights.pkl", "mod.pyc"):
        (f,) = scan_source(name, "not really binary", None)
        assert (f.rule, f.severity) == ("foreign-code", "fail"), name
    (f,) = scan_source("payload.txt", "x = 1", None)
    assert (f.rule, f.severity) == ("unparsed", "warn")


def test_kernelguard_is_the_pinned_version() -> None:
    assert version("kernelguard") == KERNELGUARD_VERSION


def test_kernelguard_catches_what_our_rules_miss() -> None:
    """State on the entry function's attributes replaying the last output: kernelguard's LAST_CALL_REPLAY."""
    src = (
        "import torch\n\ndef run(indices, grad_output, num_embeddings, padding_idx):\n"
        "    key = (id(indices), id(grad_output))\n    if getattr(run, 'key', None) == key:\n        return run.last\n"
        "    out = torch.zeros(num_embeddings, grad_output.shape[1])\n    out.index_add_(0, indices, grad_output)\n"
        "    run.key = key\n    run.last = out\n    return out\n"
    )
    assert not [f for f in scan_source("kernel.py", src, "run") if f.severity == "fail"]
    problem = CATALOGUE.get("embedding_backward")
    result = static.run(AuditContext(problem=problem, solution=_solution({"kernel.py": src}, dps=False)))
    assert result.status is StageStatus.failed
    assert result.metrics["fail_rules"] == ["kernelguard"]
    assert "LAST_CALL_REPLAY" in result.summary


def test_kernelguard_signals_only_warn() -> None:
    src = "import torch\n\ndef run(x, out):\n    out.copy_(x.to(torch.bfloat16).float())\n"
    findings = scan_solution_with_kernelguard(_solution({"kernel.py": src}))
    assert findings and all(f.rule == "kernelguard-signal" and f.severity == "warn" for f in findings)


def test_kernelguard_that_does_not_finish_is_stopped_and_reported() -> None:
    """A source that stalls kernelguard must not stall the worker: its process is killed at the limit, and the
    stage says kernelguard's checks are missing (a warning: our own rules ran in full)."""
    (f,) = scan_solution_with_kernelguard(
        _solution({"kernel.py": "def run(x, out):\n    out.copy_(x)\n"}), time_limit_s=0.001
    )
    assert (f.rule, f.severity) == ("kernelguard-incomplete", "warn")
    assert "longer than 0.001 s" in f.message


def test_scanning_never_runs_the_submission(tmp_path: Path) -> None:
    """Both rule sources read the source; neither imports or executes it."""
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').write('x')\n\ndef run(x, out):\n    out.copy_(x)\n"
    problem = CATALOGUE.get("embedding_backward")
    static.run(AuditContext(problem=problem, solution=_solution({"kernel.py": src})))
    assert not marker.exists()


def test_the_scan_reads_exactly_the_paths_the_sandbox_writes() -> None:
    """Sources `k.py` (clean) and `k.py/` (a timer patch): the model refuses the pair, and a Solution built without
    validation (model_construct) still cannot make the scan read one file while the sandbox writes another."""
    problem = CATALOGUE.get("embedding_backward")
    clean = "import torch\n\ndef run(i, g, n, p, out):\n    out.zero_()\n"
    evil = "import time\ntime.perf_counter = lambda: 0.0\n"
    for alias in ("k.py/", "./k.py"):
        spec = SolutionSpec(languages=["pytorch"], entry_point="k.py::run")
        forged = Solution.model_construct(
            name="alias",
            definition=problem.name,
            author="",
            description="",
            spec=spec,
            sources=[SourceFile(path="k.py", content=clean), SourceFile.model_construct(path=alias, content=evil)],
            compat_notes=[],
        )
        result = static.run(AuditContext(problem=problem, solution=forged))
        assert result.status is StageStatus.failed and "path-alias" in result.metrics["fail_rules"], result.summary
        assert f"{alias!r}" in result.summary
    twice = Solution.model_construct(
        name="twice",
        definition=problem.name,
        author="",
        description="",
        spec=SolutionSpec(languages=["pytorch"], entry_point="k.py::run"),
        sources=[SourceFile(path="k.py", content=clean), SourceFile(path="k.py", content=evil)],
        compat_notes=[],
    )
    result = static.run(AuditContext(problem=problem, solution=twice))
    assert result.status is StageStatus.failed and "is given twice" in result.summary
    # a valid multi-file solution: the scan's paths are the sandbox's, one each
    good = _solution({"kernel.py": clean, "pkg/helper.py": "def h():\n    return 1\n"})
    result = static.run(AuditContext(problem=problem, solution=good))
    assert result.evidence["paths"] == ["kernel.py", "pkg/helper.py"]
    assert {f["file"] for f in result.evidence["findings"]} <= {"kernel.py", "pkg/helper.py"}
