"""`kaudit`: audit a kernel from the command line.

Exit codes: 0 pass; 1 fail or error verdict; 2 bad usage or unreadable input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from worker.catalogue import Catalogue, load_catalogue, load_problem
from worker.engine import STAGES, parse_stages, run_audit
from worker.formats import (
    FormatError,
    Solution,
    load_solution,
    solution_from_python_file,
)
from worker.stages.result import AuditReport, StageStatus, Verdict

app = typer.Typer(add_completion=False, no_args_is_help=True, help="kernel-audit: what the benchmark checks, and what it misses.")

_STATUS_STYLE = {
    StageStatus.passed: "green",
    StageStatus.failed: "red",
    StageStatus.error: "magenta",
    StageStatus.skipped: "dim",
}


MAX_MESSAGE_CHARS = 2000


def _usage_error(console: Console, message: str) -> typer.Exit:
    """One line on stderr (whitespace folded, length bounded), then exit 2."""
    line = " ".join(message.split())
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 1] + "…"
    console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True, markup=True, highlight=False)
    return typer.Exit(code=2)


def read_submission(path: Path, definition: str | None, catalogue: Catalogue | None) -> Solution:
    """A solution.json, a folder holding one, or a single .py file with --definition (catalogue None: any definition).

    --definition picks the definition by its name; the file's own `definition` field need not agree (SOL-ExecBench
    runs a solution against whatever definition it is given and never compares them), and the report notes it."""
    if path.is_dir():
        path = path / "solution.json"
    if path.suffix == ".py":
        if not definition:
            raise FormatError(str(path), ["a .py file needs --definition NAME (see `kaudit problems`)"])
        solution = solution_from_python_file(path, definition)
    else:
        solution = load_solution(path)
        if definition:
            solution = solution.for_definition(definition, "named by --definition")
    if catalogue is not None and solution.definition not in catalogue:
        raise FormatError(str(path), [f"definition: unknown definition '{solution.definition}'; known: {', '.join(sorted(catalogue.problems))}"])
    return solution


def render(report: AuditReport, console: Console) -> None:
    table = Table(title=f"{report.solution} on {report.definition} ({report.device})", show_lines=False)
    table.add_column("stage")
    table.add_column("status")
    table.add_column("time", justify="right")
    table.add_column("summary", overflow="fold")
    for s in report.stages:
        style = _STATUS_STYLE[s.status]
        table.add_row(s.name, f"[{style}]{s.status.value}[/{style}]", f"{s.duration_s:.1f}s", s.summary)
    console.print(table)
    colour = {"pass": "green", "fail": "red", "error": "magenta"}[report.verdict.value]
    console.print(f"[bold {colour}]verdict: {report.verdict.value}[/bold {colour}]  {report.summary}")
    if report.isolation == "none":
        console.print("[yellow]isolation: none[/yellow] (bubblewrap unavailable: the kernel ran as you, network open)")
    elif report.isolation:
        console.print(f"isolation: {report.isolation}")


@app.command()
def audit(
    path: Annotated[Path, typer.Argument(help="solution.json, a folder with one, or a .py file (with --definition)")],
    definition: Annotated[str | None, typer.Option("--definition", "-d", help="definition name (needed for a .py file)")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    stages: Annotated[str | None, typer.Option(help=f"comma-separated subset of {','.join(STAGES)}")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object instead of the report")] = False,
    seed: Annotated[int | None, typer.Option(help="audit seed (default: a fresh secret one)")] = None,
    token_stats: Annotated[Path | None, typer.Option(
        "--token-stats", help="your token statistics (.npy or .safetensors: a histogram or a sample of ids) for the id probes")] = None,
    token_stats_kind: Annotated[str, typer.Option("--token-stats-kind", help="auto, histogram or sample")] = "auto",
    problem_dir: Annotated[Path | None, typer.Option(
        "--problem-dir", help="a SOL-ExecBench definition folder (definition.json, workload.jsonl) to audit against, "
                              "instead of the catalogue; without audit.json and oracle.py the generic probes apply")] = None,
) -> None:
    """Audit a kernel: intake, static, benchmark, probes, canary, verdict."""
    err = Console(stderr=True)
    stats = None
    if token_stats is not None:
        from pydantic import ValidationError

        from worker.probes.token_stats import TokenStats, TokenStatsError

        try:
            stats = TokenStats(path=token_stats, kind=token_stats_kind).load()  # type: ignore[arg-type]
        except ValidationError as e:
            raise _usage_error(err, f"--token-stats-kind: {e.errors()[0]['msg']}") from e
        except TokenStatsError as e:
            raise _usage_error(err, f"--token-stats: {e}") from e
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise _usage_error(err, f"--device must be cpu or cuda, not '{device}'")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise _usage_error(err, "--device cuda: no CUDA device is visible on this machine")
    try:
        chosen = parse_stages(stages)
    except ValueError as e:
        raise _usage_error(err, str(e)) from e
    try:
        if problem_dir is not None:
            own = load_problem(problem_dir)
            # the folder's name is not looked at: the problem is the definition it holds, known by that name
            solution = read_submission(path, definition or own.name, None)
            solution = solution.for_definition(own.name, f"the definition in --problem-dir {problem_dir}")
            problem = own
        else:
            catalogue = load_catalogue()
            solution = read_submission(path, definition, catalogue)
            problem = catalogue.get(solution.definition)
    except (FormatError, OSError) as e:
        raise _usage_error(err, str(e)) from e
    if solution.spec.needs_gpu and not device.startswith("cuda"):  # refused before anything is loaded or run
        raise _usage_error(err, (
            f"spec.languages {list(solution.spec.languages)}: {', '.join(solution.spec.gpu_languages)} run only on an "
            f"NVIDIA GPU (CUDA), but this audit's devices are: {device} (--device); use --device cuda on a machine "
            "with one, or audit a pytorch or triton solution"))
    problem = problem.with_token_stats(stats)
    with err.status(f"auditing {solution.name}") as status:
        report = run_audit(
            problem,
            solution,
            device=device,
            stages=chosen,
            seed=seed,
            progress=lambda msg: status.update(msg),
            on_stage=lambda r: err.print(f"  {r.name}: [{_STATUS_STYLE[r.status]}]{r.status.value}[/] {r.summary}"),
        )
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json")))
    else:
        render(report, Console())
    raise typer.Exit(code=0 if report.verdict is Verdict.pass_ else 1)


@app.command()
def problems(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the problem catalogue."""
    catalogue = load_catalogue()
    if as_json:
        typer.echo(json.dumps([
            {"name": p.name, "description": p.definition.description, "inputs": list(p.definition.inputs),
             "outputs": list(p.definition.outputs), "probes": [s.name for s in p.spec.probes],
             "examples": sorted(p.example_solutions())}
            for p in catalogue
        ]))
        return
    table = Table(title="kernel-audit problems")
    for col in ("name", "inputs", "outputs", "probes", "examples"):
        table.add_column(col, overflow="fold")
    for p in catalogue:
        table.add_row(p.name, ", ".join(p.definition.inputs), ", ".join(p.definition.outputs),
                      str(len(p.spec.probes)), ", ".join(sorted(p.example_solutions())))
    Console().print(table)


@app.command("warm-cache")
def warm_cache(
    profile: Annotated[list[str] | None, typer.Option("--profile", help="cpu and/or gpu (default: both)")] = None,
) -> None:
    """Tokenise the built-in text at every size this catalogue's audits can ask for, before any audit does.

    Each size costs about 1-2 s once per machine (KAUDIT_CACHE_DIR); an audit that finds none pays it instead."""
    from worker.text.warm import vocab_sizes, warm_text_cache

    wanted = profile or ["cpu", "gpu"]
    bad = [x for x in wanted if x not in ("cpu", "gpu")]
    if bad:
        raise _usage_error(Console(stderr=True), f"--profile must be cpu or gpu, not {', '.join(bad)}")
    catalogue = load_catalogue()
    sizes = sorted({v for name in wanted for v in vocab_sizes(catalogue, name)})  # type: ignore[arg-type]
    warm_text_cache(sizes, lambda size, secs: typer.echo(f"text tokenised at {size} ids: {secs:.2f} s"))


@app.command()
def serve(
    data_dir: Annotated[Path, typer.Option(help="where the SQLite database and the broker's files live")] = Path(".kaudit"),
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    stages: Annotated[str | None, typer.Option(help=f"comma-separated subset of {','.join(STAGES)}")] = None,
    new_admin_key: Annotated[bool, typer.Option("--new-admin-key", help="print a fresh admin API key")] = False,
) -> None:
    """Start the service on this machine: API + worker, SQLite, no broker server; prints the URL and an admin key."""
    from app.serve import PortUnavailable
    from app.serve import serve as run_service

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise _usage_error(Console(stderr=True), f"--device must be cpu or cuda, not '{device}'")
    try:
        parse_stages(stages)
    except ValueError as e:
        raise _usage_error(Console(stderr=True), f"--stages: {e}") from e
    try:
        run_service(data_dir, host, port, device=device, stages=stages, new_admin_key=new_admin_key)
    except PortUnavailable as e:
        raise _usage_error(Console(stderr=True), str(e)) from e


if __name__ == "__main__":
    app()
