"""Environment sniffing for the static scan: what a kernel would read to tell the audit from a real run.

A kernel computes the same thing wherever it runs, so it has no use for the process table, its parent,
the host, the user, the working folder or the harness's names. A submission that reads them can be exact
while watched and wrong everywhere else (issue 9: "It behaves differently when watched"), so these fail
(rule env-sniff). Reading one named variable that configures the device or a library
(`CUDA_VISIBLE_DEVICES`, `TRITON_*`) only warns (rule env-read): it is a tell too, but also ordinary.
"""

from __future__ import annotations

from worker.static.patterns import (
    ENV_TELL_EXACT,
    ENV_TELL_PARTS,
    HARNESS_NAME_TELLS,
    INSTALL_PATH_TELLS,
    INSTALL_SUFFIXES,
    SNIFF_NAMES,
    SNIFF_PATH_ROOTS,
)


def is_sniff_name(qual: str) -> bool:
    """`qual` asks who or where the process is (`os.getppid`, `sys.argv`, `Path.cwd`, `platform.node`)."""
    return qual in SNIFF_NAMES


def env_var_tell(name: str) -> bool:
    """The variable names the harness, the service, the user or the machine rather than a library setting."""
    upper = name.upper()
    return upper in ENV_TELL_EXACT or any(part in upper for part in ENV_TELL_PARTS)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def string_tell(value: str) -> tuple[str, str] | None:
    """(rule, detail) when a string constant names the machine's state, the harness, or Python's installation."""
    text = value.strip()
    if len(text) > 4096:
        return None  # an embedded source blob (a CUDA kernel string) is not a probe
    if any(_under(text, root) for root in SNIFF_PATH_ROOTS):
        return "env-sniff", f"names the path {text[:60]!r}"
    lower = text.lower()
    for tell in HARNESS_NAME_TELLS:
        if tell in lower:
            return "env-sniff", f"compares with or looks for {tell!r}"
    if any(t in lower for t in INSTALL_PATH_TELLS) or lower.endswith(INSTALL_SUFFIXES):
        return "harness-patch", f"names Python's installation ({text[:60]!r})"
    return None
