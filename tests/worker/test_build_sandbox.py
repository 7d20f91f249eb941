"""The compiler runs in the sandbox: a torch extension builds there and works; a compile that never ends is killed
at its budget; the compiler sees no worker secret and no host file; refused flags and includes never reach it."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.build import BuildCache, BuildRequest, CompileBudget, build, discover
from worker.build.builder import audit_reads
from worker.build.plan import write_ninja
from worker.build.sandboxed import BuildLayout, prepare_folder, run_ninja
from worker.sandbox.isolation import namespaces_available

pytestmark = pytest.mark.skipif(
    not namespaces_available() or shutil.which("g++") is None or discover().ninja is None,
    reason="needs bubblewrap namespaces, g++ and ninja",
)

ONE_JOB = CompileBudget(jobs=1)  # two cores shared with other work
# spins the compiler's constexpr evaluator for hours; the flags lift g++'s own loop and operation limits
SPIN = """
constexpr long spin() { long s = 0; for (long i = 0; i < 4000000000000L; ++i) s += i % 7; return s; }
static_assert(spin() > 0);
"""
SPIN_FLAGS = ["-fconstexpr-loop-limit=2147483647", "-fconstexpr-ops-limit=4611686018427387904"]


def in_fresh_process(artifact: Path, sha256: str, body: str) -> str:
    """Run `body` with `fn`, the artifact's entry function, in a new interpreter; its last printed line."""
    script = (
        "import sys, torch\nfrom pathlib import Path\nfrom worker.build import load_extension\n"
        "fn = load_extension(Path(sys.argv[1]), sys.argv[2], 'run')\n" + body
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(artifact), sha256],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def request(content: str, path: str = "k.cpp", **kw: object) -> BuildRequest:
    return BuildRequest.model_validate(
        {"sources": [{"path": path, "content": content}], "languages": ["cuda_cpp"], "entry_symbol": "run", **kw}
    )


@pytest.fixture
def cache(tmp_path: Path) -> BuildCache:
    return BuildCache(tmp_path / "cache")


@pytest.mark.slow
def test_cpp_torch_extension_builds_in_the_sandbox_loads_and_computes(cache: BuildCache) -> None:
    source = """
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x, torch::Tensor w) { return torch::relu(x) * w + 1; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run, "relu(x) * w + 1"); }
"""
    req = request(source, cflags=["-O1"])
    first = build(req, cache=cache, budget=ONE_JOB)
    assert first.ok, first.first_errors or first.compiler_log_tail
    assert first.isolation == "namespaces" and not first.cached and first.compile_seconds is not None
    assert first.artifact is not None and first.artifact.name == "benchmark_kernel.so"
    print(f"\ncpp torch extension: compiled in {first.compile_seconds:.1f} s (step {first.seconds:.1f} s)")

    # loaded as the sandboxed child will: in a process of its own (one benchmark_kernel a process)
    checked = in_fresh_process(
        first.artifact,
        first.artifact_sha256 or "",
        """
x, w = torch.randn(257), torch.randn(257)
torch.testing.assert_close(fn(x, w), torch.relu(x) * w + 1)
print("close", fn(torch.tensor([-1.0, 2.0]), torch.tensor([3.0, 4.0])).tolist())
""",
    )
    assert checked == "close [1.0, 9.0]"

    again = build(req, cache=cache, budget=ONE_JOB)
    assert again.ok and again.cached and again.compile_seconds is None
    assert again.artifact == first.artifact and again.artifact_sha256 == first.artifact_sha256
    assert again.seconds < 5, again.seconds
    print(f"cpp torch extension: cache hit in {again.seconds:.3f} s")


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_compile_that_never_ends_is_killed_at_the_wall_budget(cache: BuildCache) -> None:
    marker = f"KAUDIT_SPIN_{secrets.token_hex(4)}"
    t0 = time.monotonic()
    result = build(
        request(SPIN, cflags=[*SPIN_FLAGS, f"-D{marker}"]), cache=cache, budget=CompileBudget(jobs=1, wall_s=3)
    )
    elapsed = time.monotonic() - t0
    assert result.status == "compile_error" and result.budget_exceeded == "wall_time"
    assert result.message == "compile budget exceeded (wall time)"
    assert result.first_errors[0] == "compile budget exceeded (wall time)"
    assert result.compile_seconds is not None and 3 <= result.compile_seconds < 15
    assert elapsed < 30, elapsed
    assert _processes_with(marker) == [], "a compiler outlived its budget"
    assert list(cache.root.iterdir()) == []


def test_cpu_seconds_are_a_budget_of_each_compiler_process(cache: BuildCache) -> None:
    result = build(request(SPIN, cflags=SPIN_FLAGS), cache=cache, budget=CompileBudget(jobs=1, cpu_s=2, wall_s=120))
    assert result.status == "compile_error" and result.budget_exceeded == "cpu_time"
    assert result.message == "compile budget exceeded (CPU time)"
    assert any("CPU time limit exceeded" in e for e in result.first_errors)


def test_output_size_is_a_budget_too(cache: BuildCache) -> None:
    """A 64 MiB object against a 16 MiB output budget: the assembler is stopped, not the disk filled."""
    result = build(
        request("char big[1 << 26] = {1};\n"), cache=cache, budget=CompileBudget(jobs=1, output_bytes=16 * 2**20)
    )
    assert result.status == "compile_error" and result.budget_exceeded == "output_size"
    assert result.message == "compile budget exceeded (output size)"


def test_an_include_of_itself_ends_as_a_compile_error_in_the_compilers_words(cache: BuildCache) -> None:
    result = build(request('#include "k.cpp"\n'), cache=cache, budget=ONE_JOB)
    assert result.status == "compile_error" and result.budget_exceeded is None
    assert result.first_errors[0].startswith("k.cpp:1:"), result.first_errors  # sandbox paths cut away
    assert "#include nested depth" in result.first_errors[0]


def test_compile_errors_report_the_compilers_first_errors(cache: BuildCache) -> None:
    result = build(
        request("int run() { return undeclared_thing + 1; }\nint other() { return 1 }\n"), cache=cache, budget=ONE_JOB
    )
    assert result.status == "compile_error"
    assert result.first_errors[0].startswith("k.cpp:1:") and "undeclared_thing" in result.first_errors[0]
    assert any("k.cpp:2:" in e for e in result.first_errors)
    assert "undeclared_thing" in result.compiler_log_tail and "/tmp/work/" not in result.compiler_log_tail


def test_hostile_flags_and_host_includes_stop_before_the_compiler_runs(cache: BuildCache) -> None:
    req = BuildRequest.model_validate(
        {
            "sources": [
                {"path": "k.cpp", "content": '#include "/etc/passwd"\n'},
                {"path": "a.cpp", "content": "#include </proc/self/environ>\n"},
            ],
            "languages": ["cuda_cpp"],
            "entry_symbol": "run",
            "cflags": ["-fplugin=/tmp/x.so"],
            "cuda_cflags": ["-Xcompiler", "-B/tmp"],
            "ld_flags": ["-Wl,-rpath,/tmp"],
        }
    )
    result = build(req, cache=cache, budget=ONE_JOB)
    assert result.status == "compile_error" and result.compile_seconds is None
    assert result.message.startswith("refused before compiling: '-fplugin=/tmp/x.so': loads a plugin")
    text = "\n".join(result.first_errors)
    for named in (
        "-fplugin=/tmp/x.so",
        "-Xcompiler -B/tmp",
        "-Wl,-rpath,/tmp",
        'k.cpp:1: #include "/etc/passwd"',
        "a.cpp:1: #include </proc/self/environ>",
    ):
        assert named in text, (named, text)


def test_a_cuda_build_without_nvcc_is_the_workers_fault(cache: BuildCache) -> None:
    tc = discover().model_copy(update={"cuda_home": None})
    req = BuildRequest.model_validate(
        {
            "sources": [{"path": "k.cu", "content": "__global__ void k() {}\n"}],
            "languages": ["cuda_cpp"],
            "entry_symbol": "run",
            "target_arch": "sm_90",
        }
    )
    result = build(req, cache=cache, toolchain=tc)
    assert result.status == "toolchain_missing" and not result.ok
    assert any("this worker has no nvcc: install the gpu extra" in m for m in result.first_errors), result.first_errors


# --- below the static checks: what the sandbox itself guarantees ----------------------------------------------------


@pytest.fixture
def folder() -> Iterator[Path]:
    host = Path(tempfile.mkdtemp(prefix="build-test-"))
    prepare_folder(host)
    yield host
    shutil.rmtree(host, ignore_errors=True)


def test_the_compilers_environment_holds_no_worker_secret_and_no_host_file(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What every compiler process inherits, dumped by a build step of the sandbox's own shell."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://kaudit:pw-9f2c@db/prod")
    monkeypatch.setenv("KAUDIT_WEBHOOK_SECRET", "whsec-7d1e")
    secret_file = tmp_path / "worker-secret.txt"
    secret_file.write_text("host-secret-5b8a")
    layout = BuildLayout.for_folder(folder, isolated=True)
    out = layout.root / "out"
    (folder / "build.ninja").write_text(
        "builddir = /tmp/obj\nrule dump\n"
        f"  command = tr '\\000' '\\n' < /proc/self/environ > {out}/environ.txt && env > {out}/env.txt"
        f" && (cat {secret_file} > {out}/secret.txt 2>&1; ls / > {out}/root.txt; true)\n"
        f"build {out}/env.txt: dump\n"
    )
    tc = discover()
    assert tc.ninja is not None
    run = run_ninja(layout, tc.ninja, [Path("/usr/bin")], ONE_JOB, "namespaces")
    assert run.returncode == 0, run.log
    environ = (folder / "out" / "environ.txt").read_text()
    env = (folder / "out" / "env.txt").read_text()
    for seen in (environ, env):
        assert "pw-9f2c" not in seen and "whsec-7d1e" not in seen and "DATABASE_URL" not in seen
        assert "HOME=/tmp/work\n" in seen  # the dump worked: it shows the sandbox's own home
    assert set(dict(line.split("=", 1) for line in environ.splitlines())) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LC_ALL",
        "LANG",
        "USER",
        "LOGNAME",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
    }
    assert "host-secret-5b8a" not in (folder / "out" / "secret.txt").read_text()
    assert "No such file" in (folder / "out" / "secret.txt").read_text()
    assert "home" not in (folder / "out" / "root.txt").read_text().split()


def _build_unchecked(folder: Path, content: str) -> tuple[int | None, str]:
    """Compile `content` in the sandbox without the static scan, as if a trick had slipped past it."""
    req = request(content)
    layout = BuildLayout.for_folder(folder, isolated=True)
    (folder / "src" / "k.cpp").write_text(content)
    tc = discover()
    assert tc.ninja is not None and tc.cxx is not None
    (folder / "build.ninja").write_text(write_ninja(req, tc, layout, [], [], [], []))
    run = run_ninja(layout, tc.ninja, [tc.cxx.parent], ONE_JOB, "namespaces", tc.sandbox_roots())
    return run.returncode, run.log


def test_a_host_file_is_not_there_for_the_compiler(folder: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.h"
    secret.write_text("int leaked = 42;\n")
    returncode, log = _build_unchecked(folder, f'#include "{secret}"\nint run() {{ return leaked; }}\n')
    assert returncode != 0 and "No such file or directory" in log


def test_a_file_outside_the_solution_read_by_the_compiler_is_caught_after_the_build(folder: Path) -> None:
    returncode, log = _build_unchecked(folder, '#include "/proc/self/environ"\nint run() { return 1; }\n')
    assert returncode == 0, log  # g++ reads /proc files as empty: the build itself succeeds
    tc = discover()
    refused = audit_reads(folder, BuildLayout.for_folder(folder, isolated=True), tc)
    assert [r.flag for r in refused] == ["/proc/self/environ"]
