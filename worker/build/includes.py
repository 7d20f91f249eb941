"""What the sources may pull in at compile time: checked before the compiler runs, and again after it ran.

A source may #include the solution's own files and headers found on the build's include path (the toolchain's
system headers, torch's, CUDA's, CUTLASS's and the cuDNN frontend's); it may not name a file by an absolute path,
climb out with '..', nor include through a macro (which cannot be checked before preprocessing).

Three walls, each enough for the obvious case:
1. `check_includes` (before compiling) reads the sources as text. It errs towards refusing: a directive-shaped
   line is checked even inside a block comment or a raw string, so no comment or string trick hides a real one.
2. The sandbox shows the compiler only the toolchain's folders, and /proc/self/environ holds its scrubbed
   environment: the host's other files and the worker's secrets are not there to read.
3. `check_dependencies` (after compiling) reads the compiler's own list of every file it opened for the build
   (-MD depfiles) and refuses the artifact if one lies outside the solution and the toolchain: the exact check,
   whatever macro or trick named the file.
Assembler directives that read a file (.incbin, .include in inline asm) are not in a depfile; the plain forms are
refused here, and anything they could reach is what the sandbox shows (no more than the submission can read when
it runs).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence

from worker.build.flags import Refusal
from worker.build.request import BuildSource

# trigraphs are still honoured by g++ in strict ISO modes before C++17 (-std=c++14): ??= is '#' and ??/ a backslash
_TRIGRAPHS = {
    "??=": "#",
    "??/": "\\",
    "??'": "^",
    "??(": "[",
    "??)": "]",
    "??!": "|",
    "??<": "{",
    "??>": "}",
    "??-": "~",
}
_SPLICE = re.compile(r"\\[ \t\v\f]*\r?\n")  # g++ splices a backslash followed by spaces too (with a warning)
_KEYWORD = re.compile(r"(include_next|include|import|embed|pragma)\b")
_PRAGMA_DEPENDENCY = re.compile(r"GCC\s+(?:system_header\s+)?dependency\b")
_HAS_INCLUDE = re.compile(r"__has_(?:include_next|include|embed)\s*\(\s*(\"[^\"\n]*\"|<[^>\n]*>)")
_ASM_FILE = re.compile(r"\.(incbin|include)\s+\\?[\"<]")
_HEADER_NAME = re.compile(r'"([^"\n]*)"|<([^>\n]*)>')
MAX_REFUSALS = 50  # enough to act on; a hostile source could otherwise make a report of millions
_MAX_GAP = 512  # a comment longer than this between '#' and its keyword is not read through: refused instead


def _logical_text(content: str) -> str:
    for tri, ch in _TRIGRAPHS.items():
        content = content.replace(tri, ch)
    return _SPLICE.sub("", content)


def _skip_gap(line: str, i: int) -> int | None:
    """Index past spaces and /* */ comments from i; None when a comment runs on (unterminated or too long)."""
    start = i
    while i < len(line):
        if line[i] in " \t\v\f\r":
            i += 1
        elif line.startswith("/*", i):
            end = line.find("*/", i + 2, start + _MAX_GAP)
            if end < 0:
                return None
            i = end + 2
        else:
            break
        if i - start > _MAX_GAP:
            return None
    return i


def _directive_starts(line: str) -> Iterable[int]:
    """Where a '#' (or '%:') could begin a directive: first on the line, or right after a comment's end.

    Over-approximates on purpose: '*/ #include' counts whether or not that '*/' really closed a comment."""
    for m in re.finditer(r"#|%:", line):
        j = m.start() - 1
        while j >= 0 and line[j] in " \t\v\f":
            j -= 1
        if j < 0 or (j >= 1 and line[j - 1 : j + 1] == "*/"):
            yield m.end()


def check_includes(sources: Iterable[BuildSource]) -> list[Refusal]:
    """Every #include (and the like) that reaches outside what a solution may read; empty: all fine."""
    sources = list(sources)
    own = {s.path for s in sources}
    refusals: list[Refusal] = []
    for src in sources:
        if len(refusals) >= MAX_REFUSALS:
            break
        text = _logical_text(src.content)
        for lineno, line in enumerate(text.split("\n"), 1):
            for after_hash in _directive_starts(line):
                refusal = _check_directive(src.path, lineno, line, after_hash, own)
                if refusal is not None and len(refusals) < MAX_REFUSALS:
                    refusals.append(refusal)
        for m in _HAS_INCLUDE.finditer(text):
            reason = _refuse_target(src.path, "__has_include", m.group(1), own)
            if reason is not None:
                refusals.append(Refusal(flag=f"{src.path}: {m.group(0)}"[:300], reason=reason))
            if len(refusals) >= MAX_REFUSALS:
                break
        m = _ASM_FILE.search(text)
        if m is not None:
            refusals.append(
                Refusal(
                    flag=f"{src.path}: .{m.group(1)}", reason="an assembler directive that reads a file into the build"
                )
            )
    return refusals[:MAX_REFUSALS]


def _check_directive(path: str, lineno: int, line: str, after_hash: int, own: set[str]) -> Refusal | None:
    where = f"{path}:{lineno}: {line[:300].strip()}"  # a slice first: a line can be megabytes long
    i = _skip_gap(line, after_hash)
    if i is None:
        return Refusal(flag=where, reason="a directive hidden behind a long or unterminated comment")
    m = _KEYWORD.match(line, i)
    if m is None:
        return None
    directive = m.group(1)
    i = m.end()
    if directive == "pragma":
        j = _skip_gap(line, i)
        dep = _PRAGMA_DEPENDENCY.match(line, j) if j is not None else None
        if dep is None:
            return None
        i = dep.end()
    j = _skip_gap(line, i)
    if j is None:
        return Refusal(flag=where, reason="a directive hidden behind a long or unterminated comment")
    reason = _refuse_target(path, directive, line[j:], own)
    return Refusal(flag=where, reason=reason) if reason is not None else None


def _refuse_target(includer: str, directive: str, rest: str, own: set[str]) -> str | None:
    m = _HEADER_NAME.match(rest)
    if m is None:
        return (
            "the file is named through a macro (a computed #include), which cannot be checked before compiling; "
            "write the header's name out"
        )
    quoted = m.group(1) is not None
    name = m.group(1) if quoted else m.group(2)
    if not name:
        return "an empty header name"
    if name.startswith("/"):
        return "an absolute path reaches outside the solution and the toolchain"
    if "\\" in name:
        return "a backslash in a header name"
    if ".." not in name.split("/"):
        return None  # the solution's own folder or the include path: both hold only what a build may read
    if not quoted or directive == "pragma":
        return "'..' climbs out of the include path"
    # "../x.h" from sub/a.cu is the solution's own x.h: resolved from the including file's folder it must stay
    # inside the solution and be one of its files (were it not there, the compiler would search the include path)
    target = posixpath.normpath(posixpath.join(posixpath.dirname(includer), name))
    if target.startswith("../") or target == ".." or target not in own:
        return "'..' climbs out of the solution's folder"
    return None


# --- after the build: the compiler's own list of what it read ------------------------------------------------------


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-syntax depfile (what gcc -MD and nvcc -MD write): every file the compile read."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for rule in text.split("\n"):
        if ":" not in rule:
            continue
        # "target: dep dep"; a space inside a path is written '\ '
        _, _, prereqs = rule.partition(": ")
        if not prereqs and rule.rstrip().endswith(":"):
            continue
        for word in re.split(r"(?<!\\)\s+", prereqs.strip()):
            if word:
                deps.append(word.replace("\\ ", " ").replace("$$", "$"))
    return deps


def check_dependencies(deps: Sequence[str], source_dir: str, allowed_roots: Sequence[str]) -> list[Refusal]:
    """Every file a compile read that lies outside the solution's folder and the toolchain's (relative paths are
    relative to the build's working folder, the solution's)."""
    roots = [posixpath.normpath(r).rstrip("/") for r in (source_dir, *allowed_roots)]
    refusals: list[Refusal] = []
    for dep in dict.fromkeys(deps):
        full = posixpath.normpath(dep if dep.startswith("/") else posixpath.join(source_dir, dep))
        if not any(full == r or full.startswith(r + "/") for r in roots):
            refusals.append(
                Refusal(flag=dep, reason="the compiler read this file, which is outside the solution and the toolchain")
            )
    return refusals
