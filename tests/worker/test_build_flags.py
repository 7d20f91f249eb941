"""compile_options are allow-listed: each way a flag could reach outside the build folder or load code into the
compiler or linker is refused, naming the flag and why; the flags real solutions use pass unchanged."""

from __future__ import annotations

import pytest

from worker.build.flags import FlagKind, FlagsRefused, PathPolicy, check_flags, names_gpu_arch

TORCH_INCLUDE = "/venv/site-packages/torch/include"
CUDA_LIB = "/usr/local/cuda/lib64"
POLICY = PathPolicy(build_dir="/tmp/work/b/src", allowed_roots=(TORCH_INCLUDE, CUDA_LIB))


def refusals(kind: FlagKind, flags: list[str]) -> list[tuple[str, str]]:
    with pytest.raises(FlagsRefused) as err:
        check_flags(kind, flags, POLICY)
    return [(r.flag, r.reason) for r in err.value.refusals]


@pytest.mark.parametrize(
    ("kind", "flags", "named", "why"),
    [
        # code loaded into the compiler or the linker
        ("cflags", ["-fplugin=/tmp/evil.so"], "-fplugin=/tmp/evil.so", "plugin"),
        ("cflags", ["-fplugin-arg-evil-x=1"], "-fplugin-arg-evil-x=1", "plugin"),
        ("cflags", ["-B/tmp/bin"], "-B/tmp/bin", "other programs"),
        ("cflags", ["-specs=/tmp/s"], "-specs=/tmp/s", "specs"),
        ("cflags", ["-wrapper", "/tmp/w"], "-wrapper", "another program"),
        ("cuda_cflags", ["-ccbin", "/tmp/evil"], "-ccbin", "another program"),
        ("cuda_cflags", ["--compiler-bindir=/tmp"], "--compiler-bindir=/tmp", "another program"),
        ("ld_flags", ["-Wl,-plugin,/tmp/p.so"], "-Wl,-plugin,/tmp/p.so", "plugin into the linker"),
        # loader paths and scripts for the artifact
        ("ld_flags", ["-Wl,-rpath,/tmp/evil"], "-Wl,-rpath,/tmp/evil", "rpath"),
        ("ld_flags", ["-Wl,-rpath=/opt/x"], "-Wl,-rpath=/opt/x", "rpath"),
        ("ld_flags", ["-Wl,--dynamic-linker=/tmp/ld.so"], "-Wl,--dynamic-linker=/tmp/ld.so", "program loader"),
        ("ld_flags", ["-T", "/tmp/x.ld"], "-T", "linker script"),
        ("ld_flags", ["-Wl,-T,/tmp/x.ld"], "-Wl,-T,/tmp/x.ld", "linker script"),
        ("cflags", ["-Xlinker", "--script=/tmp/x.ld"], "-Xlinker --script=/tmp/x.ld", "linker script"),
        # reading files from anywhere
        ("cflags", ["-I/etc"], "-I/etc", "outside"),
        ("cflags", ["-I", "../../etc"], "-I ../../etc", "'..'"),
        ("cflags", ["-isystem/root"], "-isystem/root", "outside"),
        ("cflags", ["-iquote", "/home"], "-iquote /home", "outside"),
        ("cflags", ["-include", "/etc/passwd"], "-include /etc/passwd", "outside"),
        ("cflags", ["-imacros", "/proc/self/environ"], "-imacros /proc/self/environ", "outside"),
        ("cuda_cflags", ["--include-path=/etc"], "--include-path=/etc", "outside"),
        ("cuda_cflags", ["--pre-include", "/etc/shadow"], "--pre-include /etc/shadow", "outside"),
        ("ld_flags", ["-L/tmp/libs"], "-L/tmp/libs", "outside"),
        ("cflags", ["@/tmp/response"], "@/tmp/response", "response file"),
        ("cuda_cflags", ["--options-file", "f"], "--options-file", "another program"),
        # writing files, or changing what the build makes
        ("cflags", ["-o", "/tmp/x.o"], "-o", "writes files"),
        ("cflags", ["-x", "c"], "-x", "changes what the build produces"),
        ("cflags", ["-save-temps"], "-save-temps", "writes files"),
        ("cflags", ["-MD"], "-MD", "writes files"),
        ("cflags", ["-MF/tmp/deps"], "-MF/tmp/deps", "writes files"),
        ("cflags", ["-fdump-tree-all"], "-fdump-tree-all", "reads or writes files"),
        ("cflags", ["-fprofile-use=/tmp/p"], "-fprofile-use=/tmp/p", "reads or writes files"),
        ("cuda_cflags", ["--keep", "--keep-dir=/tmp"], "--keep", "writes files"),
        ("cuda_cflags", ["--dump-ptx"], "--dump-ptx", "writes files"),
        ("cuda_cflags", ["--output-directory=/tmp"], "--output-directory=/tmp", "writes files"),
        ("cuda_cflags", ["-odir", "/tmp"], "-odir", "writes files"),
        # nvcc passes -Xcompiler to the host compiler: what it carries is checked as a cflag
        ("cuda_cflags", ["-Xcompiler", "-fplugin=/tmp/evil.so"], "-Xcompiler -fplugin=/tmp/evil.so", "plugin"),
        ("cuda_cflags", ["-Xcompiler=-O3,-B/tmp"], "-Xcompiler=-O3,-B/tmp", "other programs"),
        ("cuda_cflags", ["--compiler-options", "-I,/etc"], "--compiler-options -I,/etc", "outside"),
        ("cuda_cflags", ["-Xlinker", "-rpath,/tmp/x"], "-Xlinker -rpath,/tmp/x", "rpath"),
        ("cuda_cflags", ["-Xptxas", "--foo"], "-Xptxas --foo", "allow-list"),
        # libraries beyond the allow-list, unknown flags, and the shell
        ("ld_flags", ["-lssl"], "-lssl", "not a library a solution may link"),
        ("ld_flags", ["-l:libevil.so"], "-l:libevil.so", "not a library a solution may link"),
        ("cflags", ["-frobnicate-everything=/x"], "-frobnicate-everything=/x", "allow-list"),
        ("cflags", ["--totally-unknown"], "--totally-unknown", "allow-list"),
        ("cflags", ["-DX=$(id)"], "-DX=$(id)", "shell expansion"),
        ("cflags", ["-O3\n-fplugin=x"], "-O3\n-fplugin=x", "control characters"),
    ],
)
def test_hostile_flag_is_refused_naming_it(kind: FlagKind, flags: list[str], named: str, why: str) -> None:
    found = refusals(kind, flags)
    assert any(flag == named and why in reason for flag, reason in found), found


def test_every_refusal_is_reported_not_only_the_first() -> None:
    found = refusals("cflags", ["-O2", "-fplugin=a.so", "-I/etc", "-Wall", "-o", "x"])
    assert {f for f, _ in found} >= {"-fplugin=a.so", "-I/etc", "-o"}
    assert "-O2" not in {f for f, _ in found} and "-Wall" not in {f for f, _ in found}


@pytest.mark.parametrize(
    ("kind", "flags", "tokens"),
    [
        # SOL-ExecBench's own examples, and what its solutions write
        ("cflags", ["-O3", "-march=native", "-ffast-math"], ["-O3", "-march=native", "-ffast-math"]),
        (
            "cflags",
            ["-std=c++17", "-DNDEBUG", "-DBLOCK=128", "-UFOO", "-Wall -Wextra", "-fopenmp", "-g"],
            ["-std=c++17", "-DNDEBUG", "-DBLOCK=128", "-UFOO", "-Wall", "-Wextra", "-fopenmp", "-g"],
        ),
        (
            "cflags",
            ["-Iinclude", "-I", "sub/dir", f"-isystem{TORCH_INCLUDE}"],
            ["-Iinclude", "-I", "sub/dir", f"-isystem{TORCH_INCLUDE}"],
        ),
        (
            "cuda_cflags",
            ["-use_fast_math", "--maxrregcount=128", "-arch=sm_90"],
            ["-use_fast_math", "--maxrregcount=128", "-arch=sm_90"],
        ),
        (
            "cuda_cflags",
            [
                "-O3",
                "--use_fast_math",
                "-std=c++17",
                "-lineinfo",
                "--expt-relaxed-constexpr",
                "--expt-extended-lambda",
                "-gencode=arch=compute_100a,code=sm_100a",
            ],
            [
                "-O3",
                "--use_fast_math",
                "-std=c++17",
                "-lineinfo",
                "--expt-relaxed-constexpr",
                "--expt-extended-lambda",
                "-gencode=arch=compute_100a,code=sm_100a",
            ],
        ),
        (
            "cuda_cflags",
            [
                "-gencode",
                "arch=compute_90a,code=[sm_90a,compute_90a]",
                "-Xcompiler",
                "-fopenmp,-O3",
                "-Xptxas=-v",
                "-Xcudafe --diag_suppress=177",
                "-DUSE_TMA",
            ],
            [
                "-gencode",
                "arch=compute_90a,code=[sm_90a,compute_90a]",
                "-Xcompiler",
                "-fopenmp,-O3",
                "-Xptxas=-v",
                "-Xcudafe",
                "--diag_suppress=177",
                "-DUSE_TMA",
            ],
        ),
        (
            "ld_flags",
            [
                "-lcublas",
                "-lcublasLt",
                "-lcudnn",
                "-lcuda",
                "-lcudart",
                "-Wl,--as-needed",
                f"-L{CUDA_LIB}",
                f"-Wl,-rpath,{CUDA_LIB}",
            ],
            [
                "-lcublas",
                "-lcublasLt",
                "-lcudnn",
                "-lcuda",
                "-lcudart",
                "-Wl,--as-needed",
                f"-L{CUDA_LIB}",
                f"-Wl,-rpath,{CUDA_LIB}",
            ],
        ),
    ],
)
def test_flags_solutions_use_pass_split_as_the_shell_would(kind: FlagKind, flags: list[str], tokens: list[str]) -> None:
    assert check_flags(kind, flags, POLICY) == tokens


def test_a_solution_that_names_its_gpu_gets_no_injected_arch() -> None:
    assert names_gpu_arch(["-O3", "-gencode=arch=compute_90a,code=sm_90a"])
    assert names_gpu_arch(["--gpu-architecture=sm_80"])
    assert not names_gpu_arch(["-O3", "--use_fast_math"])
