"""The ninja file of a build: the commands torch.utils.cpp_extension.load() would run for SOL-ExecBench.

SOL-ExecBench compiles a C++ solution with `torch.utils.cpp_extension.load(name="benchmark_kernel", sources=<the
top-level .cu/.cpp/.cc/.cxx/.c files>, extra_cflags=cflags, extra_cuda_cflags=["-O3", "--use_fast_math"] +
cuda_cflags, extra_ldflags=ld_flags, extra_include_paths=[<the solution folder>, <CUTLASS include>,
<CUTLASS tools/util/include>])`. load() writes a ninja file, builds, then imports the module, which runs the
submission's static initialisers in the process that built it. Here the parent writes that ninja file itself, with
torch's flags (include_paths, library_paths, COMMON_NVCC_FLAGS, -fPIC, -std=c++20, -shared, torch's libraries),
every flag quoted, and the build in the sandbox stops at the .so: it is imported only by the sandboxed child.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

from worker.build.request import BuildRequest
from worker.build.result import MODULE_NAME
from worker.build.sandboxed import BuildLayout
from worker.build.toolchain import Library, Toolchain

SOL_DEFAULT_CUDA_CFLAGS = ("-O3", "--use_fast_math")  # SOL-ExecBench puts these before the solution's own
ARTIFACT = f"{MODULE_NAME}.so"


def _q(arg: str | PurePosixPath) -> str:
    """One argument, safe for ninja (which expands $) and for the shell it hands the command to."""
    return shlex.quote(str(arg)).replace("$", "$$")


def _join(args: Sequence[str | PurePosixPath]) -> str:
    return " ".join(_q(a) for a in args)


def _ninja_path(p: PurePosixPath) -> str:
    # source paths are plain (worker.build.request), build paths ours: only ninja's own specials need escaping
    return str(p).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def write_ninja(
    request: BuildRequest,
    toolchain: Toolchain,
    layout: BuildLayout,
    cflags: Sequence[str],
    cuda_cflags: Sequence[str],
    ld_flags: Sequence[str],
    gpu_arch_flags: Sequence[str],
) -> str:
    """The build.ninja text. `cflags`/`cuda_cflags`/`ld_flags`: the solution's, already checked
    (worker.build.flags); `gpu_arch_flags`: -gencode for the target GPU when the solution names none."""
    with_cuda = request.with_cuda
    assert toolchain.cxx is not None
    user_includes = [layout.src, *toolchain.cutlass_include]
    if toolchain.cudnn_frontend_include is not None:
        user_includes.append(toolchain.cudnn_frontend_include)
    system_includes = [*toolchain.torch_include]
    if cuda_runtime(request, toolchain) and toolchain.cuda_include is not None:
        system_includes.append(toolchain.cuda_include)
    for lib in _wanted_libraries(request, toolchain):
        if lib.include is not None:
            system_includes.append(lib.include)
    system_includes.append(toolchain.python_include)
    includes = [f"-I{p}" for p in user_includes] + [a for p in system_includes for a in ("-isystem", str(p))]
    common = [f"-DTORCH_EXTENSION_NAME={MODULE_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H", *includes]

    cxx_flags = [*common, "-fPIC", "-std=c++20", *cflags]
    lines = [
        "ninja_required_version = 1.3",
        f"builddir = {_ninja_path(layout.objects)}",
        f"cxx = {_q(toolchain.cxx)}",
        f"cflags = {_join(cxx_flags)}",
    ]
    if with_cuda:
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

        assert toolchain.nvcc is not None
        user_cuda = [*SOL_DEFAULT_CUDA_CFLAGS, *cuda_flags_with_std(cuda_cflags)]
        nvcc_flags = [*common, *COMMON_NVCC_FLAGS, *gpu_arch_flags, "--compiler-options", "-fPIC", *user_cuda]
        lines += [f"nvcc = {_q(toolchain.nvcc)}", f"cuda_cflags = {_join(nvcc_flags)}"]
    lines.append(f"ldflags = {_join(link_flags(request, toolchain, ld_flags))}")
    # -MD (not torch's -MMD): the depfile lists system headers too, so the parent sees every file the compile read
    lines += ["", "rule compile", "  command = $cxx -MD -MF $dep $cflags -c $in -o $out", "  description = compile $in"]
    if with_cuda:
        lines += [
            "",
            "rule cuda_compile",
            "  command = $nvcc -MD -MF $dep $cuda_cflags -c $in -o $out",
            "  description = nvcc $in",
        ]
    lines += [
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "  description = link $out",
        "",
        "rule copy",
        "  command = cp $in $out",
        "  description = artifact $out",
        "",
    ]
    objects: list[PurePosixPath] = []
    for i, src in enumerate(request.compiled_sources):
        cuda = src.path.endswith(".cu")
        # torch names objects after the file (k.o, k.cuda.o); a counter keeps a.cpp and a.cc apart as well
        obj = layout.objects / f"{i}_{PurePosixPath(src.path).stem}{'.cuda' if cuda else ''}.o"
        objects.append(obj)
        rule = "cuda_compile" if cuda else "compile"
        lines.append(f"build {_ninja_path(obj)}: {rule} {_ninja_path(layout.src / src.path)}")
        lines.append(f"  dep = {_ninja_path(layout.root / 'deps' / (obj.name + '.d'))}")
    linked = layout.objects / ARTIFACT
    out = layout.root / "out" / ARTIFACT
    lines += [
        f"build {_ninja_path(linked)}: link {' '.join(_ninja_path(o) for o in objects)}",
        f"build {_ninja_path(out)}: copy {_ninja_path(linked)}",
        f"default {_ninja_path(out)}",
        "",
    ]
    return "\n".join(lines)


def cuda_flags_with_std(cuda_cflags: Sequence[str]) -> list[str]:
    """torch adds -std=c++20 to nvcc's flags unless one is there."""
    flags = list(cuda_cflags)
    if not any(f.startswith(("-std", "--std")) for f in flags):
        flags.append("-std=c++20")
    return flags


def gpu_arch_flags(target_arch: str | None) -> list[str]:
    """-gencode for one GPU: sm_90a -> -gencode=arch=compute_90a,code=sm_90a (SOL-ExecBench's injection)."""
    if target_arch is None:
        return []
    return [f"-gencode=arch=compute_{target_arch.removeprefix('sm_')},code={target_arch}"]


def _wanted_libraries(request: BuildRequest, toolchain: Toolchain) -> list[Library]:
    return [toolchain.libraries[w] for w in sorted(request.wanted_libraries - {"cutlass"}) if w in toolchain.libraries]


def cuda_runtime(request: BuildRequest, toolchain: Toolchain) -> bool:
    """Whether the build sees the CUDA runtime (headers, libc10_cuda, libtorch_cuda, cudart): torch's rule (a .cu
    file) or a CUDA language's .cpp-only solution on a worker that has CUDA (a cuDNN solution's main.cpp includes
    ATen/cuda headers, which need cuda.h)."""
    return request.with_cuda or (
        request.names_cuda
        and toolchain.cuda_include is not None
        and toolchain.cuda_lib is not None
        and (toolchain.torch_lib / "libtorch_cuda.so").is_file()
    )


def link_flags(request: BuildRequest, toolchain: Toolchain, ld_flags: Sequence[str]) -> list[str]:
    """torch's link line (-shared, the solution's flags, torch's libraries, cudart), with the CUDA libraries the
    solution names found where this worker has them."""
    flags = ["-shared"]
    lib_dirs = [lib.lib_dir for lib in toolchain.libraries.values()]
    names = {name: link for lib in toolchain.libraries.values() for name, link in lib.link_names.items()}
    for f in ld_flags:
        # -lcudnn where the wheel ships only libcudnn.so.9: -l:libcudnn.so.9 (the allow-list let only these through)
        flags.append(f"-l{names[f[2:]]}" if f.startswith("-l") and f[2:] in names else f)
    cuda = cuda_runtime(request, toolchain)
    flags += [f"-L{toolchain.torch_lib}", "-lc10"]
    if cuda:
        flags.append("-lc10_cuda")
    flags.append("-ltorch_cpu")
    if cuda:
        flags.append("-ltorch_cuda")
    flags += ["-ltorch", "-ltorch_python"]
    if cuda and toolchain.cuda_lib is not None:
        flags += [f"-L{toolchain.cuda_lib}", "-lcudart"]
    wanted = {"cublas": ("cublas", "cublasLt"), "cudnn": ("cudnn",)}
    for lib in _wanted_libraries(request, toolchain):
        for name in (n for group in wanted.values() for n in group if n in lib.link_names):
            flags.append(f"-l{lib.link_names[name]}")
    flags += [f"-L{d}" for d in dict.fromkeys(lib_dirs)]
    return flags
