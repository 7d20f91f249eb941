"""The name tables the static scan matches against: which modules, calls, attributes and strings each rule looks for.

Names are dotted and resolved through imports (names.py), so `torch.cuda.Event` stands for every spelling
of it in a submission. Everything here is immutable data plus the two matchers over it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from worker.formats.languages import CPP_LANGUAGES

# --- monkeypatching: what an assignment into another module touches ---------------------------------
TIMER_PREFIXES: Final = (
    "time.",
    "timeit.",
    "torch.cuda.Event",
    "torch.cuda.synchronize",
    "torch.cuda.current_stream",
    "torch.cuda.default_stream",
    "torch.cuda.Stream",
    "torch.cuda.elapsed_time",
    "torch.Event",
    "torch.cuda.nvtx",
    "triton.testing.",
    "torch.utils.benchmark.",
    "torch.profiler.",
    "triton.runtime.driver",
)
CHECKER_PREFIXES: Final = (
    "torch.allclose",
    "torch.isclose",
    "torch.equal",
    "torch.testing.",
    "torch.Tensor.",
    "torch.eq",
    "torch.abs",
    "torch.isfinite",
    "torch.isnan",
    "torch.all",
    "torch.any",
    "torch.sum",
    "torch.max",
    "torch.load",
    "torch.save",
    "numpy.",
    "torch.nn.functional.",
    "torch.Generator",
    "torch.manual_seed",
    "torch.randn",
    "torch.randint",
    "torch.rand",
)
HARNESS_ROOTS: Final = ("worker", "app", "kaudit", "sol_execbench", "flashinfer_bench", "__main__")
PATCH_FREE_PREFIXES: Final = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.", "triton.config.")
PATCH_MODULES: Final = ("unittest.mock", "mock")
REBIND_ATTRS: Final = frozenset({"__class__", "__dict__", "__code__", "__globals__"})
HARNESS_DICTS: Final = frozenset({"sys.modules", "builtins.__dict__", "__builtins__"})

# --- modules whose import alone is a finding -------------------------------------------------------
THREAD_MODULES: Final = (
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "subprocess",
    "torch.multiprocessing",
    "pty",
)
NETWORK_MODULES: Final = (
    "socket",
    "urllib",
    "urllib3",
    "requests",
    "http",
    "httpx",
    "aiohttp",
    "ftplib",
    "smtplib",
    "ssl",
    "websocket",
    "websockets",
    "xmlrpc",
    "paramiko",
    "telnetlib",
    "socketserver",
    "asyncio.streams",
    # the service's own broker and database clients: a kernel has no business with either
    "redis",
    "psycopg",
    "psycopg2",
    "asyncpg",
    "sqlalchemy",
    "celery",
    "kombu",
    "amqp",
    "pika",
    "zmq",
    "grpc",
)
RAW_MEMORY_MODULES: Final = ("ctypes", "mmap", "cffi")
# installing or re-wiring Python itself: a planted .pth or sitecustomize runs in every later process
INSTALL_MODULES: Final = ("pip", "ensurepip", "site", "sitecustomize", "usercustomize", "setuptools", "distutils")
# modules whose only use in a kernel is to learn where it runs
SNIFF_MODULES: Final = ("psutil", "pwd", "grp", "getpass")

# --- calls and names -------------------------------------------------------------------------------
INTROSPECTION_CALLS: Final = frozenset(
    {
        "inspect.stack",
        "inspect.currentframe",
        "inspect.getouterframes",
        "inspect.getinnerframes",
        "inspect.trace",
        "inspect.getframeinfo",
        "sys._getframe",
        "sys._current_frames",
        "sys.settrace",
        "sys.setprofile",
        "threading.settrace",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "traceback.extract_stack",
        "traceback.walk_stack",
        "traceback.format_stack",
        "traceback.print_stack",
    }
)
INTROSPECTION_ATTRS: Final = frozenset(
    {"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "__subclasses__"}
)
PROCESS_CALLS_PREFIX: Final = (
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.popen",
    "os.spawn",
    "os.exec",
    "os.posix_spawn",
    "os.kill",
    "os.killpg",
)
RAW_FD_CALLS: Final = frozenset(
    {
        "os._exit",
        "os.write",
        "os.writev",
        "os.dup",
        "os.dup2",
        "os.fdopen",
        "os.pipe",
        "os.open",
        "os.close",
        "os.closerange",
        "os.sendfile",
        "os.pwrite",
    }
)
DYNAMIC_CALLS: Final = frozenset(
    {
        "exec",
        "eval",
        "compile",
        "__import__",
        "importlib.import_module",
        "importlib.reload",
        "importlib.__import__",
        "runpy.run_path",
        "runpy.run_module",
        "builtins.exec",
        "builtins.eval",
    }
)
SIDE_STREAM_CALLS: Final = frozenset(
    {
        "torch.cuda.Stream",
        "torch.cuda.stream",
        "torch.cuda.set_stream",
        "torch.cuda.ExternalStream",
        "torch.cuda.StreamContext",
        "torch.Stream",
        "torch.cuda.streams.Stream",
        "torch.cuda.streams.ExternalStream",
    }
)
GRAPH_CALLS: Final = frozenset({"torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.make_graphed_callables"})
MEMO_DECORATORS: Final = frozenset(
    {"functools.lru_cache", "functools.cache", "functools.cached_property", "lru_cache", "cache"}
)
TENSOR_BASES: Final = frozenset({"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter"})
LOW_FLOATS: Final = frozenset(
    {
        "float16",
        "half",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8e4nv",
        "float8e5",
        "fp8e4nv",
        "fp8e5",
    }
)
LOW_FLOAT_NAMES: Final = frozenset({"float16", "bfloat16", "half"})
LOW_FLOAT_ROOTS: Final = frozenset({"torch", "triton", "tl", "numpy", "np"})
LOW_CAST_METHODS: Final = frozenset({"half", "bfloat16"})
CAST_METHODS: Final = frozenset({"to", "type", "view", "astype"})
PRECISION_FLAGS: Final = frozenset(
    {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction", "fp32_precision"}
)
PRECISION_CALLS: Final = frozenset(
    {"torch.set_float32_matmul_precision", "torch.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast"}
)
SETATTR_CALLS: Final = frozenset({"setattr", "builtins.setattr", "delattr", "object.__setattr__"})
FILE_CALLS: Final = frozenset(
    {"open", "io.open", "os.listdir", "os.scandir", "shutil.copy", "shutil.copyfile", "tempfile.NamedTemporaryFile"}
)
PATH_IO_METHODS: Final = frozenset({"write_text", "write_bytes", "read_text", "read_bytes"})
FILE_WRITE_METHODS: Final = frozenset({"write_text", "write_bytes", "unlink", "touch"})
FD_PATH_PREFIXES: Final = ("/proc", "/dev/fd")

# --- the environment: named reads warn, everything else that tells the audit from a real run fails ----
ENVIRON_NAMES: Final = frozenset({"os.environ", "os.environb", "posix.environ"})
ENV_CALLS: Final = frozenset(
    {"os.getenv", "os.environ.get", "os.getenvb", "os.environ.copy", "os.environ.items", "os.environ.keys"}
)
ENV_GET_CALLS: Final = frozenset(
    {"os.getenv", "os.getenvb", "os.environ.get", "os.environb.get", "os.environ.__getitem__"}
)
# variable names a kernel has no use for: the harness's, the service's, the user's and the machine's
ENV_TELL_EXACT: Final = frozenset(
    {
        "CI",
        "HOME",
        "USER",
        "LOGNAME",
        "PWD",
        "OLDPWD",
        "SHELL",
        "HOSTNAME",
        "PATH",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "TMPDIR",
        "TERM",
        "SSH_CONNECTION",
        "_",
    }
)
ENV_TELL_PARTS: Final = (
    "KAUDIT",
    "AUDIT",
    "SANDBOX",
    "BENCH",
    "PYTEST",
    "CELERY",
    "DATABASE",
    "REDIS",
    "BROKER",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "GITHUB",
    "SLURM",
    "KUBERNETES",
    "DOCKER",
    "WEBHOOK",
)
# who am I, where am I, what is my parent: a kernel computes the same thing whoever runs it
SNIFF_NAMES: Final = frozenset(
    {
        "os.getcwd",
        "os.getcwdb",
        "pathlib.Path.cwd",
        "pathlib.Path.home",
        "os.path.expanduser",
        "os.path.expandvars",
        "socket.gethostname",
        "socket.getfqdn",
        "platform.node",
        "platform.uname",
        "os.uname",
        "os.getuid",
        "os.geteuid",
        "os.getgid",
        "os.getegid",
        "os.getgroups",
        "os.getresuid",
        "os.getresgid",
        "os.getpid",
        "os.getppid",
        "os.getpgrp",
        "os.getpgid",
        "os.getsid",
        "os.getlogin",
        "os.sched_getaffinity",
        "os.getloadavg",
        "resource.getrlimit",
        "resource.getrusage",
        "sys.argv",
        "sys.orig_argv",
        "sys.executable",
        "sys.prefix",
        "sys.base_prefix",
        "sys.exec_prefix",
        "tempfile.gettempdir",
        "site.getsitepackages",
        "site.getusersitepackages",
    }
)
# string constants that name the machine's state or the harness (paths probed, names compared with)
SNIFF_PATH_ROOTS: Final = ("/proc", "/sys", "/etc", "/run", "/var/run", "/.dockerenv")
HARNESS_NAME_TELLS: Final = (
    "kaudit",
    "kernel-audit",
    "kernel_audit",
    "kernelaudit",
    "sandbox",
    "sol_execbench",
    "sol-execbench",
    "pytest",
)
# string constants that name Python's installation: writing there rewrites every later process
INSTALL_PATH_TELLS: Final = ("site-packages", "dist-packages", "sitecustomize", "usercustomize")
INSTALL_SUFFIXES: Final = (".pth",)

# --- code that is not the scanned Python -------------------------------------------------------------
FOREIGN_LOADERS: Final = frozenset(
    {
        "ctypes.CDLL",
        "ctypes.PyDLL",
        "ctypes.WinDLL",
        "ctypes.cdll.LoadLibrary",
        "ctypes.pydll.LoadLibrary",
        "ctypes.LibraryLoader",
        "ctypes.util.find_library",
        "cffi.FFI.dlopen",
        "torch.ops.load_library",
        "torch.classes.load_library",
        "torch.jit.load",
        "torch.package.PackageImporter",
        "importlib.util.spec_from_file_location",
        "importlib.util.spec_from_loader",
        "importlib.util.module_from_spec",
        "importlib.machinery.SourceFileLoader",
        "importlib.machinery.SourcelessFileLoader",
        "importlib.machinery.ExtensionFileLoader",
        "importlib.machinery.ModuleSpec",
        "zipimport.zipimporter",
        "imp.load_source",
        "imp.load_dynamic",
        "imp.load_compiled",
        "imp.load_module",
        "imp.load_package",
        "marshal.loads",
        "marshal.load",
        "pickle.load",
        "pickle.loads",
        "pickle.Unpickler",
        "_pickle.loads",
        "dill.load",
        "dill.loads",
        "cloudpickle.load",
        "cloudpickle.loads",
        "joblib.load",
        "shelve.open",
        "types.CodeType",
        "types.FunctionType",
        "sys.path.insert",
        "sys.path.append",
        "sys.path.extend",
        "sys.meta_path",
        "sys.path_hooks",
        "sys.path_importer_cache",
    }
)
# loaders that are safe unless told otherwise: keyword -> the value that makes them run code
UNSAFE_LOAD_KEYWORDS: Final = MappingProxyType(
    {"torch.load": ("weights_only", False), "numpy.load": ("allow_pickle", True)}
)
NATIVE_BUILD_CALLS: Final = frozenset({"torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"})
NATIVE_LANGUAGES: Final = CPP_LANGUAGES  # SOL-ExecBench's compiled C++ languages build native code by design
READ_CALL_LEAVES: Final = frozenset(
    {"read", "read_text", "read_bytes", "readlines", "open", "load", "loads", "decompress", "b64decode"}
)
# shipped files that are compiled or serialised: nothing can review them
BINARY_SUFFIXES: Final = (
    ".so",
    ".dll",
    ".dylib",
    ".pyd",
    ".pyc",
    ".pyo",
    ".o",
    ".a",
    ".pkl",
    ".pickle",
    ".pt",
    ".pth",
    ".bin",
    ".npy",
    ".npz",
    ".cubin",
    ".fatbin",
    ".zip",
    ".whl",
    ".egg",
)
# files a native build must never be fed: data, or the binaries above
DATA_SUFFIXES: Final = (*BINARY_SUFFIXES, ".txt", ".json", ".dat", ".yaml", ".yml", ".csv")

# --- caches: containers that outlive a call and the keys they are indexed by ---------------------------
IDENTITY_KEY_CALLS: Final = frozenset({"data_ptr", "id", "hash", "untyped_storage", "storage", "storage_offset"})
IDENTITY_KEY_ATTRS: Final = frozenset({"_cdata"})
SHAPE_KEY_CALLS: Final = frozenset({"size", "stride", "dim", "numel"})
VALUE_KEY_CALLS: Final = frozenset({"item", "tolist", "tobytes", "numpy"})
SHAPE_KEY_ATTRS: Final = frozenset({"shape", "ndim"})
CONTAINER_CTORS: Final = frozenset(
    {
        "dict",
        "list",
        "set",
        "collections.OrderedDict",
        "collections.defaultdict",
        "weakref.WeakKeyDictionary",
        "weakref.WeakValueDictionary",
        "OrderedDict",
        "defaultdict",
    }
)
CONTAINER_METHODS: Final = frozenset({"get", "setdefault", "pop", "__getitem__", "__setitem__", "__contains__"})


def starts(name: str, prefixes: tuple[str, ...]) -> bool:
    """`name` is one of the prefixes ("a.b") or inside one ("a.b.c"); a prefix ending in "." matches only inside."""
    for p in prefixes:
        if p.endswith("."):
            if name.startswith(p) or name == p[:-1]:
                return True
        elif name == p or name.startswith(p + "."):
            return True
    return False


def in_modules(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)
