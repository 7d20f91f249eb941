"""The static scan's rules: each with an id, a severity and why it matters to a benchmark.

Severity "fail" fails the static stage; "warn" is reported and left to the numerics stages.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Severity = Literal["fail", "warn"]


class Rule(BaseModel):
    id: str
    severity: Severity
    why: str


ALL_RULES = [
    Rule(id="timer-monkeypatch", severity="fail", why="replaces a timer the benchmark measures with"),
    Rule(id="checker-monkeypatch", severity="fail", why="replaces a function the checker compares results with"),
    Rule(id="harness-patch", severity="fail", why="touches the audit harness or the module table it runs from"),
    Rule(
        id="monkeypatch",
        severity="fail",
        why="assigns into another module; the submission must not change the code around it",
    ),
    Rule(id="dynamic-code", severity="fail", why="runs code built at run time, which hides it from this scan"),
    Rule(id="thread-or-process", severity="fail", why="work on a thread or another process is invisible to the timer"),
    Rule(
        id="side-stream",
        severity="fail",
        why="work on a side stream is invisible to events recorded on the default stream",
    ),
    Rule(
        id="caller-introspection",
        severity="fail",
        why="reads the caller's frames or the heap, where expected outputs could be found",
    ),
    Rule(id="network", severity="fail", why="network access: a kernel has nothing to fetch or send"),
    Rule(
        id="raw-fd",
        severity="fail",
        why="raw file-descriptor or process-exit calls can forge the harness's result channel",
    ),
    Rule(id="raw-memory", severity="fail", why="ctypes/mmap can rewrite the harness's memory"),
    Rule(
        id="tensor-subclass",
        severity="fail",
        why="a tensor subclass can defer its work into the checker or fake its values",
    ),
    Rule(
        id="output-cache",
        severity="fail",
        why="a cache keyed on pointers or object ids replays old outputs instead of computing",
    ),
    Rule(
        id="value-keyed-cache",
        severity="fail",
        why="a cache keyed on input values replays its output whenever those values repeat (a timing loop repeats them)",
    ),
    Rule(
        id="shape-keyed-cache",
        severity="warn",
        why="a module-level cache keyed on shapes (fine for workspaces, a replay cache otherwise)",
    ),
    Rule(
        id="memoized-entry", severity="fail", why="the entry point is memoized: repeated calls return a cached result"
    ),
    Rule(id="precision-downgrade", severity="warn", why="lowers the precision of a computation or matmul"),
    Rule(
        id="low-precision-cast",
        severity="warn",
        why="casts to a 16- or 8-bit float: fine for a final store, harmful inside a reduction",
    ),
    Rule(id="data-ptr", severity="warn", why="uses raw device pointers (a common ingredient of output caches)"),
    Rule(id="cross-call-state", severity="warn", why="keeps state across calls (globals or memoized helpers)"),
    Rule(id="file-access", severity="warn", why="opens files: a kernel should not need any"),
    Rule(id="env-read", severity="warn", why="reads the environment, which can tell a benchmark run from a real one"),
    Rule(
        id="env-sniff",
        severity="fail",
        why=(
            "probes where it runs (the process table, its parent, host, user, working folder, the whole environment or the"
            " harness's names): a kernel computes the same thing anywhere, and one that can tell the audit from a real run"
            " can be exact only while watched"
        ),
    ),
    Rule(
        id="foreign-code",
        severity="fail",
        why="runs code that is not the scanned Python (a shipped binary, a pickle, a loader or a data file)",
    ),
    Rule(
        id="native-extension",
        severity="warn",
        why="builds C++/CUDA at run time: allowed for compiled C++ solutions (cuda_cpp, cutlass, cudnn, cublas); its sources are not scanned here",
    ),
    Rule(id="kernelguard", severity="fail", why="kernelguard (PyPI) classifies this pattern as a hack on its own"),
    Rule(
        id="kernelguard-signal", severity="warn", why="kernelguard (PyPI) reports this pattern as a signal, not proof"
    ),
    Rule(
        id="kernelguard-incomplete",
        severity="warn",
        why="kernelguard's checks did not complete (time limit or failure); the scan's own rules still ran",
    ),
    Rule(id="cuda-graph", severity="warn", why="CUDA graph replay reuses captured pointers and can skip work"),
    Rule(id="unparsed", severity="warn", why="this file is not Python and was not scanned"),
    Rule(
        id="path-alias",
        severity="fail",
        why=("two spellings of one path let the scan read one file while the sandbox writes another over it"),
    ),
]
RULES: dict[str, Rule] = {r.id: r for r in ALL_RULES}


class Finding(BaseModel):
    file: str
    line: int
    rule: str
    severity: Severity
    message: str

    def short(self) -> str:
        return f"{self.rule} at {self.file}:{self.line}"
