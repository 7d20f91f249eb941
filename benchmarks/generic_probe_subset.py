"""Run only some of the generic path's derived probes on catalogue examples: a quick false-positive check of a new probe
family across definitions, without the whole probes stage (generic_catalogue.py runs every stage and probe).

  PYTHONPATH=. python benchmarks/generic_probe_subset.py --probes large_offset,free_axis,large_position \
      --seeds 1 --correct-only --skip layernorm_forward,rope > benchmarks/results/NAME.log

Each problem is judged with its audit.json and oracle.py set aside (Problem.as_uncurated); the probes whose names start
with one of --probes run in the sandbox as the probes stage runs them (worker.stages.probes.one_probe.run_probes).
One line per probe: its axes, whether it passed, its worst ratio per output (ratio, budget, non-finite count).
PYTHONPATH must name this checkout: the sandbox child imports `worker` from it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.expectations import runs_on
from benchmarks.generic_catalogue import known_bad
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.stages import probes as probes_stage
from worker.stages.probes.one_probe import run_probes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", required=True, help="comma-separated probe-name prefixes")
    ap.add_argument("--seeds", default="1", help="comma-separated audit seeds")
    ap.add_argument("--only", default=None, help="comma-separated definitions (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated definitions to leave out")
    ap.add_argument("--correct-only", action="store_true", help="only the examples not marked known-bad")
    args = ap.parse_args()
    prefixes = tuple(p for p in args.probes.split(",") if p)
    seeds = [int(s) for s in args.seeds.split(",")]
    only = set(args.only.split(",")) if args.only else None
    skip = set(args.skip.split(","))
    failed = ran = 0
    for problem in load_catalogue():
        if (only is not None and problem.name not in only) or problem.name in skip:
            continue
        bare = problem.as_uncurated()
        for sname, sol in sorted(bare.example_solutions().items()):
            bad = known_bad(problem.name, sname, sol.description or "")
            if not runs_on(sol.spec, "cpu") or (args.correct_only and bad):
                continue
            for seed in seeds:
                t = time.perf_counter()
                ctx = AuditContext(problem=bare, solution=sol, seed=seed)
                try:
                    spec, plan = probes_stage._spec(ctx)
                    chosen = [p for p in spec.probes if p.name.startswith(prefixes)]
                    runs = run_probes(ctx, spec.model_copy(update={"probes": chosen}), jitter=False)
                finally:
                    ctx.close()
                tag = "known-bad" if bad else "correct"
                for o in runs.outcomes:
                    note = o.not_applicable or o.kernel_error or o.input_error or o.oracle_note or ""
                    outs = {x.output: (round(x.worst_ratio, 3), x.max_ratio, x.nonfinite) for x in o.outputs}
                    print(
                        f"{problem.name}/{sname} ({tag}) seed={seed} {o.name} axes={o.axes} passed={o.passed} "
                        f"worst={o.worst_ratio:.3g} {outs} {note[:200]}",
                        flush=True,
                    )
                    ran += 1
                    failed += int(not o.passed and o.not_applicable is None)
                if plan is not None and seed == seeds[0]:
                    print(f"  not applied: {[s for s in plan.skipped if s.startswith(prefixes)]}", flush=True)
                print(f"  ({time.perf_counter() - t:.1f} s)", flush=True)
    print(f"{ran} probe runs; {failed} failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
