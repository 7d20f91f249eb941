"""Loading a built extension: only in the sandboxed child, only the exact bytes the build produced.

The parent gives the child the artifact (path or bytes), its sha256 (BuildResult.artifact_sha256) and the entry
symbol. The child checks the hash, imports the file as the module SOL-ExecBench builds (`benchmark_kernel`:
TORCH_EXTENSION_NAME, so its PyInit_benchmark_kernel) and takes the entry symbol off it, as SOL-ExecBench's driver
does. Importing runs the submission's static initialisers: that is why it happens in the child and nowhere else.
One such module per process (ModuleAlreadyLoaded says why): a child that loaded one C++ solution is not reused for
another.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.build.result import MODULE_NAME


class ArtifactMismatch(RuntimeError):
    """The file is not the artifact the build recorded."""


class EntrySymbolMissing(AttributeError):
    """The extension has no such function: SOL-ExecBench reports this as a build error (COMPILE_ERROR)."""


class ModuleAlreadyLoaded(ImportError):
    """This process already holds another `benchmark_kernel`: pybind11 (3.x) keeps modules by name for the
    interpreter's life and hands the first one back for any later file of that name. One C++ solution per process,
    as in SOL-ExecBench: load each in a fresh child."""


def load_extension(
    artifact: Path, sha256: str, entry_symbol: str, module_name: str = MODULE_NAME
) -> Callable[..., Any]:
    """The solution's entry function from its built extension."""
    data = Path(artifact).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ArtifactMismatch(f"{artifact} does not hash to the built artifact's sha256")
    import torch  # noqa: F401 - the extension's libtorch symbols resolve against the loaded torch

    loader = importlib.machinery.ExtensionFileLoader(module_name, str(artifact))
    spec = importlib.util.spec_from_file_location(module_name, str(artifact), loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {artifact} as an extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if getattr(module, "__file__", None) != str(artifact):
        raise ModuleAlreadyLoaded(
            f"a {module_name} from {getattr(module, '__file__', '?')} is already loaded in "
            f"this process: {artifact} needs a fresh one"
        )
    fn = getattr(module, entry_symbol, None)
    if not callable(fn):
        raise EntrySymbolMissing(f"exported symbol '{entry_symbol}' not found in the built extension")
    return fn
