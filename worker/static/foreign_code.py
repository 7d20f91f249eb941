"""Code that is not the scanned Python: shipped binaries, loaders, unpicklers and native builds.

A static scan only protects what it reads. A shipped `.so`, a pickle, a `.txt` exec'd or a module loaded
from a data file runs code the scan never saw, so all of them fail (rule foreign-code).

Native builds (`torch.utils.cpp_extension.load` / `load_inline`) are how SOL-ExecBench's compiled C++
languages (cuda_cpp, cutlass, cudnn, cublas) are built, so for those they only warn (rule native-extension):
their C++/CUDA sources are in the submission for a reviewer, and the benchmark and probes stages still judge
what they compute. A Python-loaded solution (pytorch, triton, cute_dsl, cutile, cudnn_frontend) that builds
native code hides work behind languages it did not declare, so there it fails (foreign-code), as does a native
build fed a file that is not C/C++/CUDA source.
"""

from __future__ import annotations

import ast
from collections.abc import Collection

from worker.static.names import call_leaf
from worker.static.patterns import (
    BINARY_SUFFIXES,
    DATA_SUFFIXES,
    DYNAMIC_CALLS,
    FOREIGN_LOADERS,
    NATIVE_BUILD_CALLS,
    NATIVE_LANGUAGES,
    READ_CALL_LEAVES,
    UNSAFE_LOAD_KEYWORDS,
)

Hit = tuple[str, str]  # (rule id, detail)


def shipped_binary(path: str) -> bool:
    """A source file of the solution that is compiled or serialised rather than reviewable text."""
    return path.lower().endswith(BINARY_SUFFIXES)


def _keyword_is(node: ast.Call, name: str, value: bool) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in node.keywords)


def _string_args(node: ast.Call) -> list[str]:
    out: list[str] = []
    for a in [*node.args, *(k.value for k in node.keywords)]:
        for n in ast.walk(a):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.append(n.value)
    return out


def _reads_data(node: ast.AST) -> bool:
    """The expression reads a file or decodes a blob (`open(p).read()`, `Path(p).read_text()`, `b64decode(...)`)."""
    return any(isinstance(n, ast.Call) and call_leaf(n) in READ_CALL_LEAVES for n in ast.walk(node))


def check_call(node: ast.Call, qual: str, languages: Collection[str]) -> Hit | None:
    """foreign-code / native-extension for one call whose callee resolves to `qual`."""
    unsafe = UNSAFE_LOAD_KEYWORDS.get(qual)
    if unsafe is not None and _keyword_is(node, unsafe[0], unsafe[1]):
        return "foreign-code", f"calls {qual}({unsafe[0]}={unsafe[1]}), which runs pickled code"
    if qual in DYNAMIC_CALLS and node.args and _reads_data(node.args[0]):
        return "foreign-code", f"calls {qual} on the contents of a file or a decoded blob"
    if qual in NATIVE_BUILD_CALLS:
        odd = [s for s in _string_args(node) if "\n" not in s and s.lower().endswith(DATA_SUFFIXES)]
        if odd:
            return "foreign-code", f"builds {odd[0]!r} with {qual}: not C/C++/CUDA source"
        if any(lang in NATIVE_LANGUAGES for lang in languages):
            return "native-extension", f"builds native code with {qual}"
        return "foreign-code", (
            f"builds native code with {qual} in a {'/'.join(languages)} solution (declare a compiled "
            "C++ language: cuda_cpp, cutlass, cudnn or cublas)"
        )
    return None


def check_loader_name(qual: str) -> Hit | None:
    if qual in FOREIGN_LOADERS:
        return "foreign-code", f"uses {qual}, which loads code this scan cannot read"
    return None
