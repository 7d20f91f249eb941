"""Where this worker's compilers and pinned headers are, found by the trusted parent before any build.

nvcc: CUDA_HOME / CUDA_PATH, /usr/local/cuda, or the CUDA wheels (`cuda-toolkit[nvcc]`, laid out under
site-packages/nvidia/cu13); CUTLASS's C++ headers from the `nvidia-cutlass` wheel (cutlass_library/source) or
CUTLASS_DIR (SOL-ExecBench's image clones CUTLASS to /usr/local/cutlass); the cuDNN frontend's headers from
`nvidia-cudnn-frontend`; cuDNN and cuBLAS from CUDA_HOME or torch's wheels. What is missing is said in words the
operator can act on. Every path found here is bound read-only into the build sandbox at the same place.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from worker.build.request import BuildRequest

GPU_EXTRA_HINT = "install the gpu extra (pip install 'kernel-audit[gpu]')"


class Library(BaseModel):
    """A CUDA library a solution may link: its headers, its folder, and how to name it to the linker."""

    model_config = ConfigDict(frozen=True)

    include: Path | None
    lib_dir: Path
    # lib -> what follows -l: the plain name where an unversioned .so is there, else ':libX.so.N' (the wheels ship
    # only the versioned file)
    link_names: dict[str, str]


class Toolchain(BaseModel):
    """What this worker builds with; its version strings are part of every cache key."""

    model_config = ConfigDict(frozen=True)

    cxx: Path | None
    cxx_version: str
    ninja: Path | None
    ninja_version: str
    cuda_home: Path | None
    cuda_note: str = Field("", description="why an nvcc that is there was not taken")
    nvcc_version: str
    torch_version: str
    torch_cuda: str | None
    torch_include: tuple[Path, ...]
    torch_lib: Path
    python_include: Path
    cutlass_include: tuple[Path, ...]
    cudnn_frontend_include: Path | None
    libraries: dict[str, Library]

    @property
    def nvcc(self) -> Path | None:
        return self.cuda_home / "bin" / "nvcc" if self.cuda_home is not None else None

    @property
    def cuda_include(self) -> Path | None:
        return self.cuda_home / "include" if self.cuda_home is not None else None

    @property
    def cuda_lib(self) -> Path | None:
        if self.cuda_home is None:
            return None
        # torch's rule: lib64 unless only lib exists (the wheels' layout)
        lib64 = self.cuda_home / "lib64"
        return lib64 if lib64.is_dir() or not (self.cuda_home / "lib").is_dir() else self.cuda_home / "lib"

    def missing_for(self, request: BuildRequest) -> list[str]:
        """Why this worker cannot build `request`, in words for the operator (empty: it can)."""
        missing: list[str] = []
        if self.cxx is None:
            missing.append("this worker has no C++ compiler (g++): install build-essential")
        if self.ninja is None:
            missing.append(f"this worker has no ninja: {GPU_EXTRA_HINT} or apt-get install ninja-build")
        if request.with_cuda:
            if self.cuda_home is None:
                missing.append(
                    f"this worker has no nvcc: {GPU_EXTRA_HINT} or set CUDA_HOME"
                    + (f" ({self.cuda_note})" if self.cuda_note else "")
                )
            if self.torch_cuda is None:
                missing.append(
                    f"this worker's torch {self.torch_version} is a CPU build: CUDA extensions link "
                    "libtorch_cuda, so install a CUDA build of torch"
                )
        wants = request.wanted_libraries
        if "cutlass" in wants and not self.cutlass_include:
            missing.append(f"this worker has no CUTLASS headers: {GPU_EXTRA_HINT} (nvidia-cutlass) or set CUTLASS_DIR")
        for lib in ("cublas", "cudnn"):
            if lib in wants and lib not in self.libraries:
                missing.append(
                    f"this worker has no {lib} library: install a CUDA build of torch ({lib} ships with it) "
                    "or the CUDA toolkit"
                )
        return missing

    def header_roots(self) -> list[Path]:
        """Folders whose headers a solution may use (with -I, -isystem or #include)."""
        roots = [*self.torch_include, self.python_include, *self.cutlass_include]
        roots += [p for p in (self.cuda_include, self.cudnn_frontend_include) if p is not None]
        roots += [lib.include for lib in self.libraries.values() if lib.include is not None]
        return [*roots, Path("/usr/include"), Path("/usr/local/include")]

    def library_roots(self) -> list[Path]:
        """Folders a solution may name with -L or an rpath."""
        roots = [self.torch_lib] + [lib.lib_dir for lib in self.libraries.values()]
        return roots + ([self.cuda_lib] if self.cuda_lib is not None else [])

    def sandbox_roots(self) -> list[Path]:
        """Everything the build reads, to be bound read-only in the sandbox."""
        tools = [p.parent for p in (self.cxx, self.ninja) if p is not None]
        home = [self.cuda_home] if self.cuda_home is not None else []
        return [p.resolve() for p in [*tools, *home, *self.header_roots(), *self.library_roots()] if p.exists()]

    def versions(self) -> dict[str, str]:
        """The strings a cache key covers: a new compiler, torch or CUDA means a new build."""
        return {
            "cxx": self.cxx_version,
            "ninja": self.ninja_version,
            "nvcc": self.nvcc_version,
            "torch": self.torch_version,
            "torch_cuda": self.torch_cuda or "",
            "python": sysconfig.get_config_var("SOABI") or sys.version,
            "cutlass": _dist_version("nvidia-cutlass") or ",".join(map(str, self.cutlass_include)),
            "cudnn_frontend": _dist_version("nvidia-cudnn-frontend") or "",
        }


def _first_line(argv: list[str], last: bool = False) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out[-1] if last else out[0]) if out else ""


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _find_ninja() -> Path | None:
    # the pinned `ninja` wheel's binary (installed beside this interpreter) first, then the system's
    wheel = Path(sysconfig.get_path("scripts")) / "ninja"
    if os.access(wheel, os.X_OK):
        return wheel
    found = shutil.which("ninja")
    return Path(found) if found else None


def runnable_by_others(path: Path) -> bool:
    """Whether a user of no group of the file's can run it: the sandbox's compiler runs as a fresh, unprivileged uid
    (a CUDA install left 0750 by its image runs for root and fails in the sandbox with "Permission denied")."""
    try:
        real = path.resolve(strict=True)
        if not real.stat().st_mode & 0o001:
            return False
        return all(p.stat().st_mode & 0o001 for p in real.parents)
    except OSError:
        return False


def _find_cuda_home() -> tuple[Path | None, str]:
    """The CUDA home to build with, and why one found was passed over."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvidia = _package_dir("nvidia")
    if nvidia is not None:
        candidates += [str(nvidia / "cu13"), str(nvidia / "cuda_nvcc")]
    passed_over = ""
    for c in candidates:
        nvcc = Path(c) / "bin" / "nvcc" if c else None
        if nvcc is None or not os.access(nvcc, os.X_OK):
            continue
        if runnable_by_others(nvcc):
            # the real folder: a symlink through /etc/alternatives (CUDA images) is one more thing the sandbox must show
            return Path(c).resolve(), ""
        passed_over = passed_over or (
            f"{nvcc} is not runnable by other users, and the sandbox compiles as one "
            f"(chmod -R o+rX {Path(c).resolve()})"
        )
    return None, passed_over


def _find_cutlass() -> tuple[Path, ...]:
    lib = _package_dir("cutlass_library")
    roots = [lib / "source"] if lib is not None else []
    if os.environ.get("CUTLASS_DIR"):
        roots.append(Path(os.environ["CUTLASS_DIR"]))
    for root in roots:
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            # SOL-ExecBench adds both: the library and its utilities (cutlass/util/...)
            return tuple(p for p in (root / "include", root / "tools" / "util" / "include") if p.is_dir())
    return ()


def _find_cudnn_frontend() -> Path | None:
    try:
        files = importlib.metadata.files("nvidia-cudnn-frontend") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "cudnn_frontend.h":
            return Path(str(f.locate())).parent
    return None


def _library(include: Path | None, lib_dir: Path, names: tuple[str, ...]) -> Library | None:
    link: dict[str, str] = {}
    for name in names:
        if (lib_dir / f"lib{name}.so").exists():
            link[name] = name
        else:
            versioned = sorted(lib_dir.glob(f"lib{name}.so.*"), key=lambda p: (len(p.name), p.name))
            if versioned:
                link[name] = f":{versioned[0].name}"
    if not link:
        return None
    return Library(
        include=include if include is not None and include.is_dir() else None, lib_dir=lib_dir, link_names=link
    )


def _find_libraries(cuda_home: Path | None) -> dict[str, Library]:
    found: dict[str, Library] = {}
    nvidia = _package_dir("nvidia")
    places: dict[str, list[tuple[Path, Path]]] = {"cublas": [], "cudnn": [], "cudart": [], "cuda": []}
    if cuda_home is not None:
        for lib in ("lib64", "lib"):
            for key in places:
                places[key].append((cuda_home / "include", cuda_home / lib))
        # the driver library has no home in the toolkit but its link stub
        places["cuda"].append((cuda_home / "include", cuda_home / "lib64" / "stubs"))
    if nvidia is not None:
        # torch's own wheels: CUDA 13 shares one folder, CUDA 12 one per library
        places["cublas"] += [
            (nvidia / "cu13" / "include", nvidia / "cu13" / "lib"),
            (nvidia / "cublas" / "include", nvidia / "cublas" / "lib"),
        ]
        places["cudnn"] += [(nvidia / "cudnn" / "include", nvidia / "cudnn" / "lib")]
        places["cudart"] += [
            (nvidia / "cu13" / "include", nvidia / "cu13" / "lib"),
            (nvidia / "cuda_runtime" / "include", nvidia / "cuda_runtime" / "lib"),
        ]
    names = {"cublas": ("cublas", "cublasLt"), "cudnn": ("cudnn",), "cudart": ("cudart",), "cuda": ("cuda",)}
    for key, options in places.items():
        for include, lib_dir in options:
            if lib_dir.is_dir() and (library := _library(include, lib_dir, names[key])) is not None:
                found[key] = library
                break
    return found


@functools.cache
def discover() -> Toolchain:
    """This worker's toolchain (looked up once a process; the version strings run each tool once)."""
    import torch
    from torch.utils import cpp_extension

    cxx_found = shutil.which("g++") or shutil.which("c++")
    cxx = Path(cxx_found) if cxx_found else None
    ninja = _find_ninja()
    cuda_home, cuda_note = _find_cuda_home()
    nvcc = cuda_home / "bin" / "nvcc" if cuda_home is not None else None
    return Toolchain(
        cxx=cxx,
        cxx_version=_first_line([str(cxx), "--version"]) if cxx else "",
        ninja=ninja,
        ninja_version=_first_line([str(ninja), "--version"]) if ninja else "",
        cuda_home=cuda_home,
        cuda_note=cuda_note,
        nvcc_version=_first_line([str(nvcc), "--version"], last=True) if nvcc else "",
        torch_version=str(torch.__version__),
        torch_cuda=torch.version.cuda,
        torch_include=tuple(Path(p) for p in cpp_extension.include_paths("cpu")),
        torch_lib=Path(cpp_extension.TORCH_LIB_PATH),
        python_include=Path(sysconfig.get_path("include", scheme="posix_prefix")),
        cutlass_include=_find_cutlass(),
        cudnn_frontend_include=_find_cudnn_frontend(),
        libraries=_find_libraries(cuda_home),
    )
