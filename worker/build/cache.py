"""Built extensions, kept under the sha256 of everything that went into them, so a re-audit does not rebuild.

The key covers the sources (paths and contents), the checked flags, the languages, dependencies, binding and
entry symbol, the target GPU, and the toolchain's version strings (compiler, nvcc, ninja, torch, its CUDA,
Python's ABI, CUTLASS, cuDNN frontend): any change is a new key. An entry is <root>/<key>/ holding the artifact
and entry.json, which records the key and the artifact's sha256. An artifact is handed out only for exactly the
key asked for, and only when its bytes still hash to what was recorded: anything else is refused (CacheRefused)
and the entry is removed, never loaded.

The cache folder is the worker's: no build sandbox ever sees it (a build writes its own folder, whose artifact
is copied in after the build).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.build.request import BuildRequest
from worker.build.result import MODULE_NAME

KEY_FORMAT = 1  # bump when what a key covers changes
_KEY = re.compile(r"[0-9a-f]{64}")


class CacheRefused(RuntimeError):
    """A cache entry that is not what it claims: never loaded."""


class CacheEntry(BaseModel):
    """entry.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(pattern=_KEY.pattern)
    artifact: str = Field(pattern=r"^[A-Za-z0-9_.-]+\.so$")
    artifact_sha256: str = Field(pattern=_KEY.pattern)
    artifact_bytes: int = Field(ge=1)
    module_name: str
    entry_symbol: str
    compile_seconds: float
    created_at: float


class CachedArtifact(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    entry: CacheEntry


def build_key(
    request: BuildRequest,
    cflags: Sequence[str],
    cuda_cflags: Sequence[str],
    ld_flags: Sequence[str],
    gpu_arch: str | None,
    toolchain_versions: dict[str, str],
) -> str:
    """sha256 of a canonical JSON of everything the artifact depends on."""
    doc = {
        "format": KEY_FORMAT,
        "module": MODULE_NAME,
        "sources": sorted([s.path, s.content] for s in request.sources),
        "languages": sorted(request.languages),
        "dependencies": sorted(request.dependencies),
        "binding": request.binding,
        "entry_symbol": request.entry_symbol,
        "cflags": list(cflags),
        "cuda_cflags": list(cuda_cflags),
        "ld_flags": list(ld_flags),
        "gpu_arch": gpu_arch,
        "toolchain": dict(sorted(toolchain_versions.items())),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class BuildCache:
    """One folder of entries; safe to share between worker processes (entries appear by an atomic rename)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _dir(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        return self.root / key

    def lookup(self, key: str) -> CachedArtifact | None:
        """The artifact stored under exactly `key`, its bytes verified; None when there is none. CacheRefused
        when an entry is there but does not hold up (it is removed first)."""
        folder = self._dir(key)
        meta = folder / "entry.json"
        if not meta.exists():
            return None
        try:
            entry = CacheEntry.model_validate_json(meta.read_bytes())
            self._verify(key, folder, entry)
        except (ValidationError, OSError, CacheRefused) as err:
            self.remove(key)
            reason = err if isinstance(err, CacheRefused) else f"unreadable entry ({type(err).__name__})"
            raise CacheRefused(f"cache entry {key[:12]} refused: {reason}") from err
        return CachedArtifact(path=folder / entry.artifact, entry=entry)

    def _verify(self, key: str, folder: Path, entry: CacheEntry) -> None:
        if entry.key != key:
            raise CacheRefused(f"it records key {entry.key[:12]}, not the key it is stored under")
        artifact = folder / entry.artifact
        if artifact.is_symlink() or not artifact.is_file():
            raise CacheRefused("its artifact is missing or not a plain file")
        if file_sha256(artifact) != entry.artifact_sha256:
            raise CacheRefused("its artifact's content does not match the recorded sha256")

    def verify(self, artifact: CachedArtifact) -> None:
        """Check again right before handing the artifact to a loader (it may have sat on disk since lookup)."""
        self._verify(artifact.entry.key, artifact.path.parent, artifact.entry)

    def store(self, key: str, built: Path, entry_symbol: str, compile_seconds: float) -> CachedArtifact:
        """Copy a fresh artifact in under `key`; where another worker stored the same key first, theirs (verified)
        is kept."""
        final = self._dir(key)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        try:
            target = staging / built.name
            shutil.copyfile(built, target)
            entry = CacheEntry(
                key=key,
                artifact=built.name,
                artifact_sha256=file_sha256(target),
                artifact_bytes=target.stat().st_size,
                module_name=MODULE_NAME,
                entry_symbol=entry_symbol,
                compile_seconds=compile_seconds,
                created_at=time.time(),
            )
            (staging / "entry.json").write_text(entry.model_dump_json(indent=1))
            os.chmod(staging, 0o755)
            try:
                os.rename(staging, final)
            except OSError:
                if not (final / "entry.json").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        found = self.lookup(key)
        assert found is not None
        return found

    def remove(self, key: str) -> None:
        shutil.rmtree(self._dir(key), ignore_errors=True)
