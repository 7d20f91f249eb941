"""The solution's compile_options, checked against an allow-list before anything runs.

A flag can do more than tune code: load a plugin into the compiler (-fplugin, -B, -specs, -wrapper, -ccbin), make
the linker run a script or record a loader path (-T, -Wl,--dynamic-linker, -Wl,-rpath), read files from anywhere
(-I/-include/@file with a path outside the toolchain) or write them (-o, -save-temps, -M*, --keep, --dump*). Only
what matches a known-harmless shape passes; every refusal names the flag and why.

SOL-ExecBench hands each flag string to torch's ninja file, where the shell splits it: "-O3 -g" is two flags. The
same split is done here (shlex), without the shell's expansions, and each piece is quoted when it is written out.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

FlagKind = Literal["cflags", "cuda_cflags", "ld_flags"]

# -l names a solution may link (torch's own libraries are linked by the build itself)
ALLOWED_LIBS = frozenset(("cublas", "cublasLt", "cudnn", "cuda", "cudart"))


class Refusal(BaseModel):
    model_config = ConfigDict(frozen=True)

    flag: str
    reason: str

    def __str__(self) -> str:
        return f"{self.flag!r}: {self.reason}"


class FlagsRefused(ValueError):
    def __init__(self, refusals: list[Refusal]) -> None:
        super().__init__("; ".join(map(str, refusals)))
        self.refusals = refusals


@dataclass(frozen=True)
class PathPolicy:
    """Where flag paths may point: the solution's own folder (relative paths resolve there) and the toolchain's."""

    build_dir: str
    allowed_roots: tuple[str, ...] = ()

    def refuse(self, path: str) -> str | None:
        """Why `path` may not be used, or None."""
        if not path:
            return "an empty path"
        if ".." in path.split("/"):
            return "the path climbs out with '..'"
        full = posixpath.normpath(path if path.startswith("/") else posixpath.join(self.build_dir, path))
        for root in (self.build_dir, *self.allowed_roots):
            root = posixpath.normpath(root)
            if full == root or full.startswith(root.rstrip("/") + "/"):
                return None
        return "the path is outside the solution and the toolchain's folders"


# --- shapes that pass -----------------------------------------------------------------------------------------------

_ARCH = r"(sm|compute|lto)_[0-9]{2,3}[af]?"
_MACRO = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", re.S)
_SAFE_GCC = [
    re.compile(p)
    for p in (
        r"-O[0-3sgz]?|-Ofast",
        r"-std=(c|gnu)(\+\+)?[0-9a-z]{2}",
        r"-W(?![lap](,|$))(no-)?[a-z0-9][a-zA-Z0-9_+=-]*",  # warnings; never -Wl, -Wa, -Wp (no commas either)
        r"-w|-pedantic|-pedantic-errors|-pthread|-pipe",
        r"-f(no-)?[a-z0-9][a-z0-9_+=.-]*",  # code generation; no '/', so no paths
        r"-m(no-)?[a-z0-9][a-z0-9_=.+-]*",  # -march=native, -mavx2, -mtune=...
        r"-g|-g[0-3]|-ggdb[0-3]?|-gdwarf(-[2-5])?",
        r"--param=[a-z0-9_-]+=[0-9]+",
    )
]
# -f options that read or write files, or load code
_UNSAFE_F = (
    "-fplugin",
    "-fno-plugin",
    "-fdump",
    "-fprofile",
    "-fno-profile",
    "-fauto-profile",
    "-fopt-info",
    "-fcallgraph-info",
    "-fdiagnostics-add-output",
    "-fdiagnostics-set-output",
    "-fcreate-profile",
    "-fbranch-probabilities",
    "-ftest-coverage",
    "-fcoverage",
    "-fstack-usage",
    "-fsave-optimization-record",
    "-fdeps-",
    "-fmodule-mapper",
    "-fmodules",
    "-fself-test",
    "-fcompare-debug",
    "-flto-incremental",
)
_SAFE_NVCC = [
    re.compile(p)
    for p in (
        r"-O[0-3]",
        r"--?use[_-]fast[_-]math",
        r"-lineinfo|--generate-line-info",
        r"--?expt-relaxed-constexpr|--?expt-extended-lambda|--?extended-lambda",
        r"--?std=c\+\+[0-9]{2}",
        r"--?maxrregcount=[0-9]+",
        r"--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)",
        r"-res-usage|--resource-usage|--display-error-number|--?restrict|--?extra-device-vectorization",
        r"-G|-g|--device-debug|--debug|-w|--disable-warnings|--keep-device-functions|--source-in-ptx|-src-in-ptx",
        r"--?W[a-z0-9][a-zA-Z0-9_+=-]*|--?Werror=[a-z0-9,-]+",
        r"--?diag[-_](suppress|error|warn)=[A-Za-z0-9_,-]+",
        r"--?(threads|split-compile)=[0-9]+|-t[0-9]+",
        r"--?(relocatable-device-code|rdc|static-global-template-stub)=(true|false)",
        r"--?cudart=(static|shared|none)|--?default-stream=(legacy|null|per-thread)",
        rf"(-gencode|--generate-code)=arch=compute_[0-9]{{2,3}}[af]?,code=(?P<br>\[)?{_ARCH}(,{_ARCH})*(?(br)\])",
        rf"(-arch|--gpu-architecture)=({_ARCH}|native|all|all-major)",
        rf"(-code|--gpu-code)={_ARCH}(,{_ARCH})*",
    )
]
_SAFE_PTXAS = re.compile(
    r"-v|--verbose|-O[0-3]|--?warn-on-[a-z-]+|--?maxrregcount=[0-9]+|-dlcm=[a-z]{2}|-dscm=[a-z]{2}"
    r"|--allow-expensive-optimizations=(true|false)|-warn-spills|-warn-lmem-usage"
)
_SAFE_CUDAFE = re.compile(r"--diag[_-](suppress|error|warning)=[A-Za-z0-9_,-]+|--display_error_number")
_SAFE_LD = re.compile(
    r"--as-needed|--no-as-needed|-O[0-2]|--gc-sections|--no-undefined|-s|--strip-all|-S"
    r"|--strip-debug|--build-id|--hash-style=(gnu|sysv|both)|-Bsymbolic(-functions)?|-E"
    r"|--export-dynamic|--icf=(all|safe|none)|--exclude-libs=ALL"
)
_SAFE_LD_DRIVER = re.compile(r"-pthread|-fopenmp|-rdynamic|-static-libstdc\+\+|-static-libgcc|-O[0-3s]?")

# --- refused outright, with the reason said --------------------------------------------------------------------------

_REFUSED_PREFIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("@",), "a response file would read flags from a file"),
    (("-fplugin", "-fno-plugin"), "loads a plugin into the compiler"),
    (("-B", "--prefix"), "points the compiler at other programs to run"),
    (("-specs", "--specs"), "a specs file can run other programs"),
    (("-wrapper",), "runs the compiler's subprocesses under another program"),
    (
        (
            "-ccbin",
            "--compiler-bindir",
            "-Xnvlink",
            "--nvlink-options",
            "-Xarchive",
            "--archive-options",
            "-Xfatbin",
            "--fatbin-options",
            "--forward-unknown",
            "--use-local-env",
            "--input-drive-prefix",
            "-idp",
            "--dependency-drive-prefix",
            "-ddp",
            "--drive-prefix",
            "-dp",
            "-Xpreprocessor",
            "-Xassembler",
            "-Wa,",
            "-Wp,",
            "--options-file",
            "-optf",
            "--run",
            "-run",
            "--dryrun",
            "-dryrun",
        ),
        "hands control to another program or unchecked options",
    ),
    (
        (
            "-o",
            "--output-file",
            "-odir",
            "--output-directory",
            "--keep",
            "-keep",
            "-save-temps",
            "--save-temps",
            "-M",
            "--dependency-output",
            "--generate-dependencies",
            "--generate-nonsystem-dependencies",
            "-MF",
            "-time=",
            "--dump",
            "-dump",
            "--list-gpu",
            "-fdiagnostics-format",
        ),
        "writes files outside the build's own outputs",
    ),
    (
        (
            "-x",
            "--x",
            "-c",
            "--compile",
            "-E",
            "--preprocess",
            "-S",
            "-ptx",
            "--ptx",
            "-cubin",
            "--cubin",
            "-fatbin",
            "--fatbin",
            "-lib",
            "--lib",
            "-shared",
            "--shared",
            "-static",
            "--device-c",
            "-dc",
            "--device-link",
            "-dlink",
            "-print",
            "--print",
            "-###",
            "-link",
            "--link",
        ),
        "changes what the build produces (the build decides that)",
    ),
    (("-T", "-Wl,-T", "--script", "-dT"), "a linker script can pull in any file"),
    (("-iprefix", "-iwithprefix", "-isysroot", "--sysroot", "-nostdinc"), "moves the system header folders"),
)


def _refused_prefix(tok: str) -> str | None:
    for prefixes, reason in _REFUSED_PREFIXES:
        for p in prefixes:
            # '-M' and '-o' refuse their whole families (-MD, -MMD, -MF, -ofile); others match as a flag or a prefix
            # of flag=value; bare '-c'/'-S'/'-E'/'-x' only as themselves or with an attached value
            if (
                tok == p
                or tok.startswith(p + "=")
                or (
                    p
                    in (
                        "-M",
                        "-o",
                        "@",
                        "-B",
                        "-x",
                        "-T",
                        "-dT",
                        "-Wa,",
                        "-Wp,",
                        "-fplugin",
                        "-fno-plugin",
                        "--dump",
                        "-dump",
                        "--keep",
                        "-keep",
                        "-specs",
                        "--specs",
                        "-Wl,-T",
                        "-print",
                        "--print",
                        "-fdiagnostics-format",
                    )
                    and tok.startswith(p)
                )
            ):
                return reason
    return None


# options whose value may come in the next token (nvcc and gcc both accept "-I dir" and "-Idir")
_PATH_OPTS = {
    "-I": "include",
    "--include-path": "include",
    "-isystem": "include",
    "--system-include": "include",
    "-iquote": "include",
    "-idirafter": "include",
    "-include": "file",
    "--pre-include": "file",
    "--preinclude": "file",
    "-imacros": "file",
    "-L": "lib",
    "--library-path": "lib",
}
_ATTACHED_PATH_OPTS = ("-I", "-L")  # gcc also takes -Idir, -Ldir (the others only with '=' or a space)
_VALUE_OPTS_NVCC = {
    "-Xcompiler",
    "--compiler-options",
    "-Xlinker",
    "--linker-options",
    "-Xptxas",
    "--ptxas-options",
    "-Xcudafe",
    "-gencode",
    "--generate-code",
    "-arch",
    "--gpu-architecture",
    "-code",
    "--gpu-code",
    "-t",
    "--threads",
    "-std",
    "--std",
    "-l",
    "--library",
    "-D",
    "--define-macro",
    "-U",
    "--undefine-macro",
    "-maxrregcount",
    "--maxrregcount",
    "-default-stream",
    "--default-stream",
}
_VALUE_OPTS_GCC = {"-Xlinker", "-D", "-U", "-l", "-include", "-imacros"}


@dataclass
class _Checker:
    kind: FlagKind
    paths: PathPolicy
    refusals: list[Refusal] = field(default_factory=list)

    def refuse(self, flag: str, reason: str) -> None:
        self.refusals.append(Refusal(flag=flag, reason=reason))

    # each check_* takes one option (with its value where it has one) and records a refusal or nothing

    def check_path(self, flag: str, opt: str, value: str) -> None:
        kind = _PATH_OPTS[opt]
        roots_note = {"include": "headers", "file": "included files", "lib": "libraries"}[kind]
        reason = self.paths.refuse(value)
        if reason is not None:
            self.refuse(flag, f"{reason} ({opt} {roots_note} may come only from the solution or the toolchain)")

    def check_lib(self, flag: str, name: str) -> None:
        if name not in ALLOWED_LIBS:
            self.refuse(
                flag, f"-l{name} is not a library a solution may link (allowed: {', '.join(sorted(ALLOWED_LIBS))})"
            )

    def check_macro(self, flag: str, value: str) -> None:
        if not _MACRO.fullmatch(value):
            self.refuse(flag, "not a macro name")

    def check_linker_args(self, flag: str, args: list[str]) -> None:
        """Options for ld itself (after -Wl, or -Xlinker)."""
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("-rpath", "--rpath", "-rpath-link", "--rpath-link", "-L", "--library-path"):
                if i + 1 >= len(args):
                    self.refuse(flag, f"{a} without a folder")
                    return
                self._check_ld_path(flag, a, args[i + 1])
                i += 2
                continue
            m = re.fullmatch(r"(--?rpath(?:-link)?|--library-path)=(.*)|-L(.+)", a)
            if m:
                self._check_ld_path(flag, a, m.group(2) if m.group(2) is not None else m.group(3))
            elif a.startswith("-l") or a.startswith("--library="):
                self.check_lib(flag, a.removeprefix("--library=").removeprefix("-l"))
            elif a in ("-z",) and i + 1 < len(args) and args[i + 1] in ("now", "relro", "defs", "noexecstack"):
                i += 1
            elif a.startswith(("-T", "--script", "-dT", "--default-script")):
                self.refuse(flag, "a linker script can pull in any file")
                i += a in ("-T", "--script", "-dT", "--default-script")  # and its file
            elif a.startswith(("-I", "--dynamic-linker")):
                self.refuse(flag, "sets the program loader the artifact asks for")
                i += a in ("-I", "--dynamic-linker")
            elif a.startswith(("-plugin", "--plugin")):
                self.refuse(flag, "loads a plugin into the linker")
                i += a in ("-plugin", "--plugin")
            elif not _SAFE_LD.fullmatch(a):
                self.refuse(flag, f"linker option {a!r} is not on the allow-list")
            i += 1

    def _check_ld_path(self, flag: str, opt: str, value: str) -> None:
        reason = self.paths.refuse(value)
        if reason is not None:
            what = "an rpath" if "rpath" in opt else "a library folder"
            self.refuse(flag, f"{reason} ({what} may name only the solution's or the toolchain's folders)")

    def check_gcc(self, flag: str, tok: str, next_tok: Callable[[], str | None]) -> None:
        """One g++ option (cflags, or a piece of -Xcompiler)."""
        if tok.startswith("-Wl,"):
            self.check_linker_args(flag, tok.split(",")[1:])
            return
        opt, value = _split_option(tok, _PATH_OPTS, _ATTACHED_PATH_OPTS)
        if opt is not None:
            value = value if value is not None else next_tok()
            if value is None:
                self.refuse(flag, f"{opt} without a value")
            else:
                self.check_path(flag if value in flag else f"{flag} {value}", opt, value)
            return
        if (reason := _refused_prefix(tok)) is not None:
            self.refuse(flag, reason)
            return
        if tok in ("-D", "-U"):
            value = next_tok()
            self.check_macro(f"{tok} {value}", value or "")
        elif tok.startswith(("-D", "-U")):
            self.check_macro(flag, tok[2:])
        elif tok == "-Xlinker":
            value = next_tok() or ""
            self.check_linker_args(f"{flag} {value}", [value])
        elif tok == "-l":
            self.check_lib(flag, next_tok() or "")
        elif tok.startswith("-l"):
            self.check_lib(flag, tok[2:])
        elif tok.startswith("-f") and tok.startswith(_UNSAFE_F):
            self.refuse(flag, "this -f option reads or writes files of its own")
        elif not any(p.fullmatch(tok) for p in _SAFE_GCC):
            self.refuse(flag, "not on the allow-list of compiler flags")

    def check_nvcc(self, flag: str, tok: str, next_tok: Callable[[], str | None]) -> None:
        opt, value = _split_option(tok, _PATH_OPTS, _ATTACHED_PATH_OPTS)
        if opt is not None:
            value = value if value is not None else next_tok()
            if value is None:
                self.refuse(flag, f"{opt} without a value")
            else:
                self.check_path(flag if value in flag else f"{flag} {value}", opt, value)
            return
        name, eq, attached = tok.partition("=")
        if name in _VALUE_OPTS_NVCC:
            value = attached if eq else next_tok()
            if value is None:
                self.refuse(flag, f"{name} without a value")
                return
            self._check_nvcc_valued(flag if eq else f"{flag} {value}", name, value)
            return
        if (reason := _refused_prefix(tok)) is not None:
            self.refuse(flag, reason)
        elif any(p.fullmatch(tok) for p in _SAFE_NVCC):
            return  # before -l: -lineinfo is no library
        elif tok.startswith(("-D", "-U")):
            self.check_macro(flag, tok[2:])
        elif tok.startswith("-l"):
            self.check_lib(flag, tok[2:])
        else:
            self.refuse(flag, "not on the allow-list of nvcc flags")

    def _check_nvcc_valued(self, flag: str, name: str, value: str) -> None:
        pieces = [v for v in value.split(",") if v]
        if name in ("-Xcompiler", "--compiler-options"):
            # nvcc hands each comma-separated piece to the host compiler: each must pass as a cflag on its own
            it = iter(pieces)
            for piece in it:
                self.check_gcc(flag, piece, lambda: next(it, None))
        elif name in ("-Xlinker", "--linker-options"):
            self.check_linker_args(flag, pieces)
        elif name in ("-Xptxas", "--ptxas-options"):
            for piece in pieces:
                if not _SAFE_PTXAS.fullmatch(piece):
                    self.refuse(flag, f"ptxas option {piece!r} is not on the allow-list")
        elif name == "-Xcudafe":
            if not _SAFE_CUDAFE.fullmatch(value):
                self.refuse(flag, f"cudafe option {value!r} is not on the allow-list")
        elif name in ("-l", "--library"):
            for piece in pieces:
                self.check_lib(flag, piece)
        elif name in ("-D", "--define-macro", "-U", "--undefine-macro"):
            self.check_macro(flag, value)
        else:
            spelled = {
                "-gencode": "-gencode",
                "--generate-code": "-gencode",
                "-arch": "-arch",
                "--gpu-architecture": "-arch",
                "-code": "-code",
                "--gpu-code": "-code",
                "-t": "--threads",
                "--threads": "--threads",
                "-std": "-std",
                "--std": "-std",
                "-maxrregcount": "-maxrregcount",
                "--maxrregcount": "-maxrregcount",
                "-default-stream": "--default-stream",
                "--default-stream": "--default-stream",
            }[name]
            if not any(p.fullmatch(f"{spelled}={value}") for p in _SAFE_NVCC):
                self.refuse(flag, f"{name} {value!r} is not a value the allow-list knows")

    def check_ld(self, flag: str, tok: str, next_tok: Callable[[], str | None]) -> None:
        """One option of the link command (g++ as the linker driver)."""
        if tok.startswith("-Wl,"):
            self.check_linker_args(flag, tok.split(",")[1:])
        elif tok == "-Xlinker":
            value = next_tok() or ""
            self.check_linker_args(f"{flag} {value}", [value])
        elif tok == "-l":
            self.check_lib(flag, next_tok() or "")
        elif tok.startswith("-l"):
            self.check_lib(flag, tok[2:])
        elif tok == "-L" or tok.startswith("-L"):
            value = tok[2:] or next_tok()
            if value is None:
                self.refuse(flag, "-L without a folder")
            else:
                self._check_ld_path(flag, "-L", value)
        elif (reason := _refused_prefix(tok)) is not None:
            self.refuse(flag, reason)
        elif not _SAFE_LD_DRIVER.fullmatch(tok):
            self.refuse(flag, "not on the allow-list of link flags")


def _split_option(tok: str, table: dict[str, str], attached: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(option, value) when `tok` is a path option: value None means it is in the next token."""
    if tok in table:
        return tok, None
    name, eq, value = tok.partition("=")
    if eq and name in table:
        return name, value
    for opt in attached:
        if tok.startswith(opt) and len(tok) > len(opt):
            return opt, tok[len(opt) :]
    for opt in ("-isystem", "-iquote", "-idirafter"):  # gcc also takes these glued: -isystemdir
        if tok.startswith(opt) and len(tok) > len(opt):
            return opt, tok[len(opt) :]
    return None, None


def split_flags(flags: Sequence[str]) -> tuple[list[tuple[str, str]], list[Refusal]]:
    """Each flag string split as the shell would (without expanding anything): (piece, the string it came from)."""
    out: list[tuple[str, str]] = []
    refusals: list[Refusal] = []
    for flag in flags:
        if any(ord(c) < 32 for c in flag):
            refusals.append(Refusal(flag=flag, reason="control characters (a newline) in a flag"))
            continue
        if any(c in flag for c in "$`"):
            refusals.append(Refusal(flag=flag, reason="shell expansion ($, `) is not performed here"))
            continue
        try:
            pieces = shlex.split(flag)
        except ValueError as err:
            refusals.append(Refusal(flag=flag, reason=f"cannot be split into arguments ({err})"))
            continue
        out += [(p, flag) for p in pieces]
    return out, refusals


def check_flags(kind: FlagKind, flags: Sequence[str], paths: PathPolicy) -> list[str]:
    """The flags as separate arguments, ready to be quoted into a command; FlagsRefused lists every refusal."""
    pieces, refusals = split_flags(flags)
    checker = _Checker(kind, paths, refusals)
    it: Iterator[tuple[str, str]] = iter(pieces)

    def next_tok() -> str | None:
        nxt = next(it, None)
        return nxt[0] if nxt is not None else None

    check = {"cflags": checker.check_gcc, "cuda_cflags": checker.check_nvcc, "ld_flags": checker.check_ld}[kind]
    for tok, flag in it:
        check(flag, tok, next_tok)
    if checker.refusals:
        raise FlagsRefused(checker.refusals)
    return [p for p, _ in pieces]


def names_gpu_arch(cuda_tokens: Sequence[str]) -> bool:
    """Whether the solution's nvcc flags already choose the GPU (then the build adds no -gencode of its own)."""
    return any(
        t.startswith(("-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code"))
        for t in cuda_tokens
    )
