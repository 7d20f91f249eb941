"""Audit every problem folder without audit.json through the generic path, and tabulate what it catches.

  python benchmarks/generic_catalogue.py --out benchmarks/results/generic_catalogue_cpu.md
  python benchmarks/generic_catalogue.py --with-curated --jobs 2 --out generic.md   # curated ones too, judged generically
  python benchmarks/generic_catalogue.py --only layernorm_forward,rope --paths curated \
      --out benchmarks/results/curated_layernorm_rope_cpu.md       # the curated probes where the generic path missed

Stages intake, static, benchmark, probes on the CPU (or --device cuda). The generic path's measurement covers
the folders without audit.json and the ones curated afterwards because it missed their known-bad example
(CURATED_AFTER_GENERIC): those are audited with their audit.json and oracle.py explicitly stripped
(Problem.as_uncurated), so the table keeps measuring the generic path alone. Other curated problems join
only with --with-curated, judged the same way. `--paths curated` audits the CURATED_AFTER_GENERIC problems
with their audit.json and oracle.py instead, in a section "Caught by the curated probes".
Writes markdown to --out and the same rows as JSON beside it (.json).
An example is known-bad when benchmarks/expectations.py lists it or its description starts "Known-bad".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.audit_examples import device_name
from benchmarks.audit_progress import ProgressLog, summary
from benchmarks.expectations import KNOWN_BAD, runs_on
from benchmarks.parallel import run_jobs
from worker.catalogue import Catalogue, Problem, load_catalogue
from worker.engine import run_audit

STAGES = ("intake", "static", "benchmark", "probes")
PATHS = ("generic", "curated")
# added without audit.json to measure the generic path, curated afterwards where it missed the known-bad example
# (benchmarks/results/generic_catalogue_cpu.md): the generic measurement still audits them uncurated
CURATED_AFTER_GENERIC: tuple[str, ...] = ("layernorm_forward", "rope")


def known_bad(problem: str, solution: str, description: str) -> bool:
    return (problem, solution) in KNOWN_BAD or description.strip().lower().startswith("known-bad")


def caught_by(probes: dict[str, Any]) -> list[str]:
    """Failed probes and checks of the probes stage (what caught the kernel)."""
    metrics = probes.get("metrics", {})
    failed = [n for n, m in metrics.get("probes", {}).items() if m.get("passed") is False]
    failed += [f"check:{n}" for n, c in metrics.get("checks", {}).items() if not c.get("passed")]
    return failed


def in_generic_measurement(problem: Problem, with_curated: bool) -> bool:
    """Whether the generic path's table audits this problem (always uncurated: see audit_row)."""
    return not problem.curated or with_curated or problem.name in CURATED_AFTER_GENERIC


def audit_row(
    problem_name: str, sname: str, device: str, path: str, canary: bool = False, progress_file: str | None = None
) -> dict[str, Any]:
    """One audit: `path` "generic" strips any audit.json and oracle.py; "curated" keeps them (and requires them).
    With `canary`, the canary stage runs too: its site is then matched from the signature alone (worker.canary.matching).
    `progress_file`: where the audit's progress goes as it runs (benchmarks.audit_progress), read back if it never
    returns."""
    log = ProgressLog(Path(progress_file)) if progress_file else None
    problem = load_catalogue().get(problem_name)
    curated_folder = problem.curated
    if path == "generic" and problem.curated:
        problem = problem.as_uncurated()
    elif path == "curated" and not problem.curated:
        raise ValueError(f"{problem_name} has no audit.json: nothing curated to audit")
    sol = problem.example_solution(sname)
    t0 = time.perf_counter()
    report = run_audit(
        problem,
        sol,
        device=device,
        stages=(*STAGES, "canary") if canary else STAGES,
        seed=secrets.randbits(62),
        progress=log.note if log else None,
        on_stage=log.stage if log else None,
    )
    stages = {s.name: s for s in report.stages}
    probes = stages["probes"].model_dump(mode="json")
    bench = stages["benchmark"]
    return {
        "definition": problem_name,
        "example": sname,
        "path": path,
        "curated_folder": curated_folder,
        "known_bad": known_bad(problem_name, sname, sol.description or ""),
        "description": sol.description,
        "benchmark": bench.status.value,
        "benchmark_summary": bench.summary,
        f"{path}_probes": probes["status"],
        "probes_summary": probes["summary"],
        "caught_by": caught_by(probes),
        # per probe: its worst group's error ratio (None: non-finite, or nothing measured)
        "probe_ratios": {n: m.get("worst_ratio") for n, m in probes.get("metrics", {}).get("probes", {}).items()},
        "worst_ratio": probes.get("metrics", {}).get("worst_ratio"),
        "oracle": probes.get("evidence", {}).get("oracle"),
        "not_applied": probes.get("evidence", {}).get("generic", {}).get("not_applied"),
        "not_applicable": probes.get("evidence", {}).get("not_applicable"),
        "seed_note": "probe axes and seeds in the probes stage evidence",
        # why a stage before the benchmark stopped the audit (the rows after it then read "skipped")
        **({"intake_summary": stages["intake"].summary} if stages["intake"].status.value != "passed" else {}),
        "wall_s": round(time.perf_counter() - t0, 1),
        **({"canary": canary_cells(stages["canary"].model_dump(mode="json"))} if "canary" in stages else {}),
    }


def canary_cells(stage: dict[str, Any]) -> dict[str, Any]:
    """What the table and the JSON keep of a canary stage: status, the site and how it matched, the fidelity."""
    m = stage.get("metrics", {})
    return {
        "status": stage["status"],
        "site": m.get("site"),
        "site_match": m.get("site_match"),
        "fidelity_worst_ratio": m.get("fidelity_worst_ratio"),
        "loss_gap": m.get("loss_gap"),
        "noise_band": m.get("noise_band"),
        "loss_threshold": m.get("loss_threshold"),
        "seconds": stage.get("duration_s"),
        "summary": str(stage.get("summary", ""))[:400],
    }


def path_of(row: dict[str, Any]) -> str:
    return row.get("path", "generic")  # rows recorded before the curated path existed are generic


def probes_status(row: dict[str, Any]) -> str:
    return row[f"{path_of(row)}_probes"]


def inconclusive(row: dict[str, Any]) -> bool:
    """A stage ended `error` (out of time or device memory, a worker limit): no verdict, for or against the kernel."""
    return "error" in (row["benchmark"], probes_status(row))


def worth_redoing(row: dict[str, Any]) -> bool:
    """Whether a resumed run audits this row again, whole, under --redo-inconclusive: no verdict came back (a stage
    error), or the canary ended in an error or never ran for want of time. A row with every verdict it can have,
    a canary with no site to run at included, stays."""
    canary = row.get("canary") or {}
    canary_cut = canary.get("status") == "error" or (
        canary.get("status") == "skipped" and "budget ran out" in str(canary.get("summary", ""))
    )
    return "inconclusive" in verdict_cell(row) or canary_cut


def verdict_cell(row: dict[str, Any]) -> str:
    probes, which = probes_status(row), f"the {path_of(row)} probes"
    if not row["known_bad"]:
        if "failed" in (row["benchmark"], probes):
            return "correct example: FLAGGED (false positive)"
        return "correct example: inconclusive (a stage error)" if inconclusive(row) else "correct example: passes"
    if row["benchmark"] == "failed":
        return "known-bad: caught by the benchmark rule" + (f" and {which}" if probes == "failed" else "")
    if probes == "failed":
        return f"known-bad: caught only by {which}"
    return "known-bad: inconclusive (a stage error)" if inconclusive(row) else "known-bad: MISSED by both"


def ratio_cell(row: dict[str, Any]) -> str:
    if row["worst_ratio"] is None:
        return "non-finite" if "infx" in row["probes_summary"] else ""
    return "non-finite" if row["worst_ratio"] == float("inf") else f"{row['worst_ratio']:.3g}x"


def _caught(row: dict[str, Any]) -> str:
    """The failed probes and checks, each with its worst ratio where the row recorded one."""
    ratios = row.get("probe_ratios") or {}

    def one(name: str) -> str:
        if name not in ratios:
            return name
        r = ratios[name]
        return f"{name} ({'non-finite' if r is None or r == float('inf') else f'{r:.3g}x'})"

    return ", ".join(one(n) for n in row["caught_by"][:4]) + ("..." if len(row["caught_by"]) > 4 else "")


def _table(rows: list[dict[str, Any]], path: str) -> list[str]:
    canary = any("canary" in r for r in rows)
    lines = [
        f"| definition | example | benchmark | {path} probes | caught by | worst ratio | "
        + ("canary (site, fidelity x ideal) | " if canary else "")
        + "outcome | time |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if canary else ""),
    ]
    for r in rows:
        caught = _caught(r)
        lines.append(
            f"| {r['definition']} | {r['example']} | {r['benchmark']} | {probes_status(r)} | {caught or '-'} | "
            f"{ratio_cell(r)} | "
            + (f"{canary_cell(r)} | " if canary else "")
            + f"{verdict_cell(r)} | {r['wall_s']} s |"
        )
    return lines


def canary_cell(row: dict[str, Any]) -> str:
    c = row.get("canary")
    if c is None:
        return "-"
    if c["status"] == "skipped":
        return "skipped"
    fid = c.get("fidelity_worst_ratio")
    return f"{c['status']} ({c.get('site') or '?'}, {'-' if fid is None else f'{fid:.3g}x'}, {c.get('seconds') or 0:.1f} s)"


def markdown(rows: list[dict[str, Any]], header: str, unfinished: list[dict[str, Any]] | None = None) -> str:
    generic = [r for r in rows if path_of(r) == "generic"]
    curated = [r for r in rows if path_of(r) == "curated"]
    lines = [header, ""]
    if generic:
        lines += _table(generic, "generic")
    if curated:
        lines += ([""] if generic else []) + [
            "## Caught by the curated probes",
            "",
            f"The definitions curated after the generic path missed their known-bad example ({', '.join(CURATED_AFTER_GENERIC)}), "
            "audited with their audit.json and oracle.py.",
            "",
            *_table(curated, "curated"),
        ]
    if unfinished:
        lines += ["", "## Unfinished audits", "", "Where each had got to when the run ended (its progress file):", ""]
        lines += [
            f"- **{u['definition']}/{u['example']}** ({u['path']}): {u['why']}; {u['progress']}" for u in unfinished
        ]
    lines += ["", "Probe summaries:", ""]
    for r in rows:
        tag = " (curated)" if path_of(r) == "curated" else ""
        lines.append(
            f"- **{r['definition']}/{r['example']}**{tag}: benchmark: {r['benchmark_summary']} | probes: {r['probes_summary']}"
        )
    return "\n".join(lines) + "\n"


def plan_jobs(
    catalogue: Catalogue, device: str, paths: tuple[str, ...], only: set[str] | None, with_curated: bool
) -> list[tuple[str, str, str, str]]:
    """(problem, example, device, path) for every audit the run makes, generic ones first."""
    jobs = []
    for path in paths:
        for problem in catalogue:
            if only is not None and problem.name not in only:
                continue
            if path == "generic" and not in_generic_measurement(problem, with_curated):
                continue
            if path == "curated" and not (problem.name in CURATED_AFTER_GENERIC and problem.curated):
                continue
            for sname, sol in sorted(problem.example_solutions().items()):
                if runs_on(sol.spec, device):
                    jobs.append((problem.name, sname, device, path))
    return jobs


def breadth_first(jobs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The jobs reordered: every definition's first example (job[0] names it), then every second one, and so on."""
    rank: dict[str, int] = {}
    keyed = []
    for i, job in enumerate(jobs):
        rank[job[0]] = rank.get(job[0], -1) + 1
        keyed.append((rank[job[0]], i, job))
    return [job for _, _, job in sorted(keyed)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--with-curated", action="store_true", help="also audit curated problems, judged generically")
    ap.add_argument(
        "--paths",
        default="generic",
        help=f"comma-separated of {','.join(PATHS)}: curated audits {', '.join(CURATED_AFTER_GENERIC)} with their audit.json",
    )
    ap.add_argument("--only", default=None, help="comma-separated definitions")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--canary", action="store_true", help="run the canary stage too (site matched from the signature)")
    ap.add_argument("--budget-s", type=float, default=float("inf"))
    ap.add_argument(
        "--breadth-first",
        action="store_true",
        help="one example of every definition before the second of any, so a run its budget cuts short still spans "
        "the catalogue",
    )
    ap.add_argument(
        "--fresh-process",
        action="store_true",
        help="each audit in a new process, so that no device memory one audit's process holds is there for the next "
        "(benchmarks/canary_sites.py --fresh-process says why)",
    )
    ap.add_argument("--out", type=Path, required=True, help="markdown file; the JSON rows go beside it")
    ap.add_argument(
        "--resume", action="store_true", help="keep the rows already in --out's JSON and audit only the rest"
    )
    ap.add_argument(
        "--redo-inconclusive",
        action="store_true",
        help="with --resume, audit again the rows without a verdict (a stage error) or whose canary ended in an "
        "error or ran out of time",
    )
    args = ap.parse_args()
    paths = tuple(p for p in args.paths.split(",") if p)
    if not paths or set(paths) - set(PATHS):
        ap.error(f"--paths takes a comma-separated subset of {','.join(PATHS)}")
    catalogue = load_catalogue()
    only = set(args.only.split(",")) if args.only else None
    progress_dir = args.out.with_suffix(".progress")  # one file per audit, read back for those that never return
    jobs = [
        (*j, args.canary, str(progress_dir / f"{j[0]}__{j[1]}__{j[3]}.jsonl"))
        for j in plan_jobs(catalogue, args.device, paths, only, args.with_curated)
    ]
    rows: list[dict[str, Any]] = []
    previous = (
        json.loads(args.out.with_suffix(".json").read_text())
        if args.resume and args.out.with_suffix(".json").exists()
        else None
    )
    if previous is not None:
        rows = [r for r in previous["rows"] if not (args.redo_inconclusive and worth_redoing(r))]
        done = {(r["definition"], r["example"], path_of(r)) for r in rows}
        jobs = [j for j in jobs if (j[0], j[1], j[3]) not in done]
    if args.breadth_first:
        jobs = breadth_first(jobs)
    for job in jobs:  # a resumed run's files are an earlier run's: this run reports only its own
        Path(job[5]).unlink(missing_ok=True)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    import torch

    machine = f"{args.device}: {device_name(args.device)}, torch {torch.__version__}, {started}"
    scope = []
    if "generic" in paths:
        scope.append(
            "generic path: problems without audit.json and, with audit.json and oracle.py stripped, "
            + (
                "every curated one"
                if args.with_curated
                else f"those curated after it ({', '.join(CURATED_AFTER_GENERIC)})"
            )
        )
    if "curated" in paths:
        scope.append(f"curated path: {', '.join(CURATED_AFTER_GENERIC)} with their audit.json and oracle.py")
    title = (
        "Generic path over the catalogue"
        if paths == ("generic",)
        else ("Curated probes where the generic path missed" if paths == ("curated",) else "Generic and curated paths")
    )
    header = (
        previous["header"]
        if previous is not None
        else (
            f"# {title} ({machine})\n\nStages {','.join((*STAGES, 'canary') if args.canary else STAGES)}; "
            + "; ".join(scope)
            + "."
        )
    )

    unfinished: list[dict[str, Any]] = []
    died: dict[tuple[str, str, str], str] = {}

    def write() -> None:
        rows.sort(key=lambda r: (PATHS.index(path_of(r)), r["definition"], r["example"]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(rows, header, unfinished))
        record = {"header": header, "rows": rows, **({"unfinished": unfinished} if unfinished else {})}
        args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        print(
            f"{row['definition']}/{row['example']} ({path_of(row)}): benchmark {row['benchmark']}, probes {probes_status(row)} "
            f"({row['wall_s']} s) -> {verdict_cell(row)}",
            flush=True,
        )
        write()

    left = run_jobs(
        audit_row,
        jobs,
        workers=args.jobs,
        budget_s=args.budget_s,
        on_result=record,
        tasks_per_process=1 if args.fresh_process else None,
        on_died=lambda job, why: died.__setitem__((job[0], job[1], job[3]), why),
    )
    finished = {(r["definition"], r["example"], path_of(r)) for r in rows}
    for job in jobs:
        if (job[0], job[1], job[3]) not in finished:
            progress = summary(Path(job[5]))
            why = died.get((job[0], job[1], job[3])) or (
                "stopped by the run's time budget" if Path(job[5]).exists() else "never started"
            )
            unfinished.append(
                {
                    "definition": job[0],
                    "example": job[1],
                    "path": job[3],
                    "why": why,
                    "progress": progress.describe(),
                    "stages": progress.model_dump(mode="json"),
                }
            )
            print(f"unfinished: {job[0]}/{job[1]} ({job[3]}): {why}; {progress.describe()}", flush=True)
    write()
    outcomes = [verdict_cell(r) for r in rows]
    missed = sum("MISSED" in o for o in outcomes)
    false_pos = sum("FLAGGED" in o for o in outcomes)
    print(
        f"{len(rows)} audits; {missed} known-bad missed; {false_pos} correct examples flagged; "
        f"{sum('inconclusive' in o for o in outcomes)} inconclusive; {left} unfinished"
    )
    if args.canary:
        ran = [r for r in rows if r.get("canary", {}).get("status") in ("passed", "failed")]  # a verdict came back
        errored = [r for r in rows if r.get("canary", {}).get("status") == "error"]
        canary_fp = [r for r in ran if not r["known_bad"] and r["canary"]["status"] == "failed"]
        print(
            f"canary: ran to a verdict for {len(ran)} of {len(rows)} audits "
            f"({len({r['definition'] for r in ran})} of {len({r['definition'] for r in rows})} definitions), "
            f"{len(errored)} ended error; {len(canary_fp)} correct examples flagged by it"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
