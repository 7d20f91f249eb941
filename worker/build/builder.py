"""One build, start to end: check, look up the cache, compile in the sandbox, audit what was read, store.

    result = build(request, cache=BuildCache(root))

Order matters: the toolchain first (a worker that cannot build says so, inconclusive), then every check that needs
no compiler (flags, #includes: COMPILE_ERROR naming what was refused), then the cache (an artifact verified for
exactly this key), and only then the compiler, in the sandbox, under the compile budget.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from worker.build import includes
from worker.build.cache import BuildCache, CacheRefused, build_key
from worker.build.flags import FlagsRefused, PathPolicy, Refusal, check_flags, names_gpu_arch
from worker.build.plan import ARTIFACT, gpu_arch_flags, write_ninja
from worker.build.request import BuildRequest
from worker.build.result import BUDGET_EXCEEDED, BuildResult, first_errors
from worker.build.sandboxed import (
    BuildLayout,
    BuildUnavailable,
    CompileBudget,
    SandboxRun,
    prepare_folder,
    remove_folder,
    run_ninja,
)
from worker.build.toolchain import Toolchain, discover
from worker.sandbox.isolation import Isolation

_BUDGET_WORDS = {
    "wall_time": "wall time",
    "cpu_time": "CPU time",
    "memory": "memory",
    "output_size": "output size",
    "processes": "processes",
}


def build(
    request: BuildRequest,
    *,
    cache: BuildCache,
    budget: CompileBudget | None = None,
    toolchain: Toolchain | None = None,
    isolation: Isolation = "namespaces",
    work_root: Path | None = None,
) -> BuildResult:
    """Build `request` into a torch extension (module `benchmark_kernel`), or say why not.

    `isolation`: "namespaces" (the default, and the only one for untrusted sources) or "none" (a developer's own
    code where bubblewrap is unavailable). `work_root`: where build folders are made (the system's temp folder)."""
    t0 = time.monotonic()
    budget = budget or CompileBudget()
    tc = toolchain or discover()

    def done(**kw: object) -> BuildResult:
        return BuildResult(
            entry_symbol=request.entry_symbol, seconds=round(time.monotonic() - t0, 3), isolation=isolation, **kw
        )  # type: ignore[arg-type]

    missing = tc.missing_for(request)
    if missing:
        return done(status="toolchain_missing", message="; ".join(missing), first_errors=missing)

    folder = Path(tempfile.mkdtemp(prefix="build-", dir=work_root))
    try:
        layout = BuildLayout.for_folder(folder, isolated=isolation == "namespaces")
        policy = PathPolicy(
            build_dir=str(layout.src), allowed_roots=tuple(str(p) for p in [*tc.header_roots(), *tc.library_roots()])
        )
        refusals: list[Refusal] = []
        checked: dict[str, list[str]] = {}
        for kind, flags in (
            ("cflags", request.cflags),
            ("cuda_cflags", request.cuda_cflags),
            ("ld_flags", request.ld_flags),
        ):
            try:
                checked[kind] = check_flags(kind, flags, policy)  # type: ignore[arg-type]
            except FlagsRefused as err:
                refusals += err.refusals
        refusals += includes.check_includes(request.sources)
        if refusals:
            lines = [str(r) for r in refusals]
            return done(
                status="compile_error", message=f"refused before compiling: {lines[0]}", first_errors=lines[:20]
            )

        arch_flags: list[str] = []
        if request.with_cuda and not names_gpu_arch(checked["cuda_cflags"]):
            if request.target_arch is None:
                return done(
                    status="toolchain_missing",
                    message="no target GPU: the build needs target_arch (e.g. sm_90a) or an -arch flag",
                    first_errors=["no target GPU architecture given"],
                )
            arch_flags = gpu_arch_flags(request.target_arch)
        key = build_key(
            request,
            checked["cflags"],
            checked["cuda_cflags"],
            checked["ld_flags"],
            request.target_arch if request.with_cuda else None,
            tc.versions(),
        )

        cache_note = None
        try:
            hit = cache.lookup(key)
        except CacheRefused as err:
            hit, cache_note = None, str(err)
        if hit is not None:
            return done(
                status="built",
                artifact=hit.path,
                artifact_sha256=hit.entry.artifact_sha256,
                key=key,
                cached=True,
                message=f"cached build ({hit.entry.compile_seconds:.1f} s when compiled)",
            )

        prepare_folder(folder)
        for src in request.sources:
            target = folder / "src" / src.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(src.content)
        (folder / "build.ninja").write_text(
            write_ninja(request, tc, layout, checked["cflags"], checked["cuda_cflags"], checked["ld_flags"], arch_flags)
        )
        assert tc.ninja is not None and tc.cxx is not None
        path_dirs = [tc.cxx.parent] + ([tc.nvcc.parent] if request.with_cuda and tc.nvcc is not None else [])
        try:
            run = run_ninja(layout, tc.ninja, path_dirs, budget, isolation, ro_roots=tc.sandbox_roots())
        except BuildUnavailable as err:
            return done(
                status="toolchain_missing",
                message=str(err).splitlines()[0],
                first_errors=[str(err)[:500]],
                cache_note=cache_note,
            )
        strip = (str(layout.src), str(layout.root), str(layout.objects))
        log_tail = _tail(run.log, strip)
        if run.returncode != 0:
            return done(
                **_failure(run, strip),
                compile_seconds=round(run.seconds, 3),
                compiler_log_tail=log_tail,
                cache_note=cache_note,
            )

        read = audit_reads(folder, layout, tc)
        if read:
            lines = [str(r) for r in read]
            return done(
                status="compile_error",
                message=f"the compile read a file outside what a solution may: {read[0].flag}",
                first_errors=lines[:20],
                compile_seconds=round(run.seconds, 3),
                compiler_log_tail=log_tail,
                cache_note=cache_note,
            )
        built = folder / "out" / ARTIFACT
        if not built.is_file() or built.is_symlink():
            return done(
                status="compile_error",
                message="the build produced no extension",
                compile_seconds=round(run.seconds, 3),
                compiler_log_tail=log_tail,
                cache_note=cache_note,
            )
        stored = cache.store(key, built, request.entry_symbol, run.seconds)
        return done(
            status="built",
            artifact=stored.path,
            artifact_sha256=stored.entry.artifact_sha256,
            key=key,
            compile_seconds=round(run.seconds, 3),
            compiler_log_tail=log_tail,
            cache_note=cache_note,
            message=f"compiled in {run.seconds:.1f} s",
        )
    finally:
        remove_folder(folder)


def _failure(run: SandboxRun, strip: tuple[str, ...]) -> dict[str, object]:
    errors = first_errors(run.log, strip=strip)
    if run.budget_exceeded is not None:
        what = _BUDGET_WORDS[run.budget_exceeded]
        message = f"{BUDGET_EXCEEDED} ({what})"
        return {
            "status": "compile_error",
            "message": message,
            "first_errors": [message, *errors][:8],
            "budget_exceeded": run.budget_exceeded,
        }
    return {
        "status": "compile_error",
        "message": errors[0] if errors else f"the build failed (exit {run.returncode})",
        "first_errors": errors,
    }


def _tail(log: str, strip: tuple[str, ...], n: int = 4000) -> str:
    for prefix in strip:
        log = log.replace(prefix.rstrip("/") + "/", "")
    return log[-n:]


def audit_reads(folder: Path, layout: BuildLayout, tc: Toolchain) -> list[Refusal]:
    """After a build: what the compilers say they read (their -MD depfiles), checked against the solution's folder
    and the toolchain's (worker.build.includes, the third wall)."""
    headers = [*tc.header_roots(), Path("/usr/include"), Path("/usr/lib/gcc"), Path("/usr/local/include")]
    if tc.cuda_home is not None:
        headers.append(tc.cuda_home)  # nvcc names its headers as <cuda_home>/bin/../targets/<arch>/include/...
    roots = list(dict.fromkeys(str(p) for h in headers for p in (h, h.resolve())))
    depfiles = sorted((folder / "deps").glob("*.d"))
    if len(depfiles) != len(request_objects(folder)):
        return [Refusal(flag="deps/", reason="a compile left no list of the files it read")]
    deps: list[str] = []
    for depfile in depfiles:
        deps += includes.parse_depfile(depfile.read_text(errors="replace"))
    return includes.check_dependencies(deps, str(layout.src), roots)


def request_objects(folder: Path) -> list[str]:
    """The objects the ninja file builds (one depfile each)."""
    text = (folder / "build.ninja").read_text()
    return [line for line in text.splitlines() if line.startswith("  dep = ")]
