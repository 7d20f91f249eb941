"""The build cache hands out an artifact only for exactly its key and only with the bytes it recorded: a rebuild of
the same request is a hit, a tampered entry is refused (and rebuilt), an entry under the wrong key is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from worker.build import (
    ArtifactMismatch,
    BuildCache,
    BuildRequest,
    CacheRefused,
    CompileBudget,
    build,
    discover,
    load_extension,
)
from worker.build.cache import build_key, file_sha256
from worker.sandbox.isolation import namespaces_available

from tests.worker.test_build_sandbox import in_fresh_process

# pybind11 alone compiles in seconds (torch/extension.h takes a minute): enough to exercise the cache
PYBIND_ONLY = """
#include <pybind11/pybind11.h>
int run(int a, int b) { return a * 10 + b; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""
needs_sandbox = pytest.mark.skipif(
    not namespaces_available() or shutil.which("g++") is None or discover().ninja is None,
    reason="needs bubblewrap namespaces, g++ and ninja",
)


def request(content: str = PYBIND_ONLY, **kw: object) -> BuildRequest:
    return BuildRequest.model_validate(
        {"sources": [{"path": "k.cpp", "content": content}], "languages": ["cuda_cpp"], "entry_symbol": "run", **kw}
    )


def key_of(req: BuildRequest, versions: dict[str, str] | None = None, arch: str | None = None) -> str:
    return build_key(
        req,
        list(req.cflags),
        list(req.cuda_cflags),
        list(req.ld_flags),
        arch,
        versions or {"cxx": "g++ 12.2.0", "torch": "2.13.0"},
    )


def test_the_key_changes_with_everything_the_artifact_depends_on() -> None:
    base = key_of(request())
    assert key_of(request()) == base
    assert (
        len(
            {
                base,
                key_of(request(PYBIND_ONLY + "// changed\n")),
                key_of(request(cflags=["-O1"])),
                key_of(request(ld_flags=["-lcudart"])),
                key_of(request(entry_symbol="other")),
                key_of(request(), {"cxx": "g++ 13.1.0", "torch": "2.13.0"}),
                key_of(request(), {"cxx": "g++ 12.2.0", "torch": "2.13.1"}),
                key_of(request(), arch="sm_90a"),
                key_of(request(dependencies=["cublas"])),
            }
        )
        == 9
    )


def test_an_entry_recorded_under_another_key_is_refused(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    artifact = tmp_path / "benchmark_kernel.so"
    artifact.write_bytes(b"\x7fELF not really, but bytes with a hash")
    stored = cache.store(key_of(request()), artifact, "run", 1.0)
    other = key_of(request(cflags=["-O1"]))
    shutil.copytree(stored.path.parent, cache.root / other)
    with pytest.raises(CacheRefused, match="records key"):
        cache.lookup(other)
    assert not (cache.root / other).exists(), "a refused entry is removed"
    assert cache.lookup(key_of(request())) is not None


def test_an_entry_whose_bytes_changed_is_refused(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    artifact = tmp_path / "benchmark_kernel.so"
    artifact.write_bytes(b"original bytes")
    key = key_of(request())
    stored = cache.store(key, artifact, "run", 1.0)
    assert stored.entry.artifact_sha256 == file_sha256(artifact)
    stored.path.write_bytes(b"swapped bytes")
    with pytest.raises(CacheRefused, match="sha256"):
        cache.verify(stored)
    with pytest.raises(CacheRefused, match="sha256"):
        cache.lookup(key)
    assert cache.lookup(key) is None


@needs_sandbox
@pytest.mark.slow
def test_a_rebuild_is_a_cache_hit_and_a_tampered_entry_is_rebuilt_never_loaded(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    budget = CompileBudget(jobs=1)
    first = build(request(), cache=cache, budget=budget)
    assert first.ok and not first.cached, first.first_errors or first.compiler_log_tail
    print(f"\npybind11-only extension: compiled in {first.compile_seconds:.1f} s")
    hit = build(request(), cache=cache, budget=budget)
    assert hit.cached and hit.artifact == first.artifact and hit.compile_seconds is None

    assert hit.artifact is not None and hit.artifact_sha256 is not None
    good = hit.artifact.read_bytes()
    # a flipped byte in the stored .so (a disk fault, or someone else's hand)
    hit.artifact.write_bytes(good[:-64] + bytes([good[-64] ^ 0xFF]) + good[-63:])
    with pytest.raises(ArtifactMismatch):
        load_extension(hit.artifact, hit.artifact_sha256, "run")

    rebuilt = build(request(), cache=cache, budget=budget)
    assert rebuilt.ok and not rebuilt.cached
    assert rebuilt.cache_note is not None and "sha256" in rebuilt.cache_note
    assert rebuilt.artifact is not None and rebuilt.artifact_sha256 is not None
    assert file_sha256(rebuilt.artifact) == rebuilt.artifact_sha256  # the tampered bytes are gone
    assert in_fresh_process(rebuilt.artifact, rebuilt.artifact_sha256, "print(fn(4, 2))") == "42"
