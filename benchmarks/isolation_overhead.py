"""What the OS isolation costs an audit: sandbox start (spawn, torch import, first reply) with and without bubblewrap.

  python benchmarks/isolation_overhead.py [--device cpu] [--n 10] [--out benchmarks/results/isolation_overhead_cpu.txt]

Each trial starts a sandbox, loads a one-line solution, makes one call and closes it (what every audit
pays once), alternating the two policies so that both see the same page cache and machine load.
Writes the medians and their difference; the target is at most 0.5 s per audit.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from worker.formats import Solution
from worker.sandbox import Isolation, Sandbox, namespaces_available
from worker.sandbox import isolation as isolation_mod

TARGET_S = 0.5
SOLUTION = Solution.model_validate(
    {
        "name": "identity",
        "definition": "identity",
        "spec": {"languages": ["pytorch"], "entry_point": "k.py::run", "destination_passing_style": False},
        "sources": [{"path": "k.py", "content": "def run(x):\n    return x.clone()\n"}],
    }
)


def one_audit_start(isolation: Isolation, device: str) -> tuple[float, float]:
    """Seconds to a started sandbox, and to the first call's reply."""
    t0 = time.perf_counter()
    sb = Sandbox(device, isolation=isolation)
    sb.start()
    started = time.perf_counter() - t0
    try:
        sb.load(SOLUTION)
        sb.request("call", {"args": [torch.ones(4)], "outputs": [], "poison": None})
        first = time.perf_counter() - t0
    finally:
        sb.close()
    return started, first


def bare_spawn(isolation: Isolation, device: str) -> float:
    """Seconds to run /bin/true with the sandbox's own bwrap argv (or bare): the namespaces' setup alone."""
    with tempfile.TemporaryDirectory() as tmp:
        spill_dir = Path(tmp) / "spill"
        spill_dir.mkdir()
        command = ["/bin/true"]
        r, w = os.pipe()
        try:
            if isolation == "namespaces":
                bwrap = isolation_mod.bwrap_binary()
                assert bwrap is not None
                policy = isolation_mod.IsolationPolicy()
                command = isolation_mod.bwrap_argv(
                    bwrap, isolation_mod.sandbox_uid(policy), policy, spill_dir, w, device, command
                )
            t0 = time.perf_counter()
            subprocess.run(command, check=True, pass_fds=(w,))
            return time.perf_counter() - t0
        finally:
            os.close(r)
            os.close(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/isolation_overhead_cpu.txt"))
    ns = ap.parse_args()
    if not namespaces_available():
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text("bubblewrap namespaces are not available on this host: nothing to compare\n")
        print(ns.out.read_text(), end="")
        return
    bare = {
        iso: statistics.median(bare_spawn(iso, ns.device) for _ in range(ns.n))  # type: ignore[arg-type]
        for iso in ("none", "namespaces")
    }
    one_audit_start("none", ns.device)  # warm the page cache for both
    runs: dict[str, list[tuple[float, float]]] = {"namespaces": [], "none": []}
    for _ in range(ns.n):
        for iso in ("namespaces", "none"):
            runs[iso].append(one_audit_start(iso, ns.device))  # type: ignore[arg-type]
    med = {iso: (statistics.median(s for s, _ in r), statistics.median(f for _, f in r)) for iso, r in runs.items()}
    overhead = med["namespaces"][1] - med["none"][1]
    lines = [
        f"isolation overhead per audit, {ns.device}, median of {ns.n} (alternating), "
        f"{platform.node()} {platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"{'policy':<12} {'start s':>9} {'to first reply s':>17}",
        *(f"{iso:<12} {med[iso][0]:>9.3f} {med[iso][1]:>17.3f}" for iso in ("none", "namespaces")),
        f"overhead (namespaces - none, to first reply): {overhead:+.3f} s; target <= {TARGET_S} s: "
        f"{'met' if overhead <= TARGET_S else 'NOT met'}",
        f"namespace setup alone (/bin/true through the sandbox's bwrap argv vs bare), median of {ns.n}: "
        f"{bare['namespaces'] * 1e3:.1f} ms vs {bare['none'] * 1e3:.1f} ms",
        f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the start times above include "
        "it; the setup line does not depend on it much)",
        "all trials (start, first reply) s: "
        + "; ".join(f"{iso}: " + ", ".join(f"({s:.2f}, {f:.2f})" for s, f in r) for iso, r in runs.items()),
    ]
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
