"""`kaudit`: audit a kernel from the command line.

Exit codes: 0 pass; 1 fail or error verdict; 2 bad usage or unreadable input.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from worker.catalogue import DEFAULT_ROOT, Catalogue, load_catalogue, load_problem
from worker.engine import parse_stages, run_audit
from worker.formats import (
    FormatError,
    Solution,
    Workload,
    load_solution,
    solution_from_python_file,
)
from worker.registry import audit_stages, register_extra_stages
from worker.stages.result import AuditReport, StageStatus, Verdict

if TYPE_CHECKING:
    from app.core.settings import Settings
    from worker.dataset_import import ImportReport

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="kernel-audit: what the benchmark checks, and what it misses."
)

_STATUS_STYLE = {
    StageStatus.passed: "green",
    StageStatus.failed: "red",
    StageStatus.error: "magenta",
    StageStatus.skipped: "dim",
}


MAX_MESSAGE_CHARS = 2000
_STAGES_HELP = f"comma-separated subset of {','.join(audit_stages())}, and of the stages KAUDIT_EXTRA_STAGES adds"


def _usage_error(console: Console, message: str) -> typer.Exit:
    """One line on stderr (whitespace folded, length bounded), then exit 2."""
    line = " ".join(message.split())
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 1] + "…"
    console.print(f"[red]error:[/red] {escape(line)}", soft_wrap=True, markup=True, highlight=False)
    return typer.Exit(code=2)


def _settings(err: Console) -> Settings:
    """The KAUDIT_ settings, read as the service reads them (app.core.settings), so the CLI and the service agree."""
    from pydantic import ValidationError

    from app.core.settings import Settings

    try:
        return Settings()
    except ValidationError as e:
        raise _usage_error(err, f"the KAUDIT_ settings do not validate: {e.errors()[0]['msg']}") from e


def _configured_catalogue_root(err: Console) -> Path | None:
    """KAUDIT_CATALOGUE_ROOT."""
    return _settings(err).catalogue_root


def _chosen_stages(err: Console, stages: str | None, prefix: str = "") -> tuple[str, ...]:
    """--stages, checked against every registered stage: the built-in ones and KAUDIT_EXTRA_STAGES's."""
    register_extra_stages(_settings(err).extra_stages)
    try:
        return parse_stages(stages)
    except ValueError as e:
        raise _usage_error(err, f"{prefix}{e}") from e


def catalogue_root(err: Console, explicit: Path | None) -> Path:
    """--catalogue, else KAUDIT_CATALOGUE_ROOT, else the curated catalogue shipped in kernels/."""
    root = explicit or _configured_catalogue_root(err) or DEFAULT_ROOT
    if not root.is_dir():
        source = "--catalogue" if explicit else "KAUDIT_CATALOGUE_ROOT"
        raise _usage_error(err, f"{source} {root}: not a folder")
    return root


def open_catalogue(err: Console, explicit: Path | None) -> Catalogue:
    root = catalogue_root(err, explicit)
    try:
        return load_catalogue(root)
    except (FormatError, OSError) as e:
        raise _usage_error(err, f"catalogue {root}: {e}") from e


def _writable_folder(path: Path) -> bool:
    """`path` is a folder this user can write into, or could be made as one (its nearest existing parent is)."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


_CATALOGUE_OPTION = typer.Option(
    "--catalogue",
    help="a catalogue folder (one folder per problem, as `kaudit problems import` writes); "
    "default: KAUDIT_CATALOGUE_ROOT, else the curated problems shipped in kernels/",
)


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
        raise FormatError(
            str(path),
            [f"definition: unknown definition '{solution.definition}'; known: {', '.join(sorted(catalogue.problems))}"],
        )
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
    definition: Annotated[
        str | None, typer.Option("--definition", "-d", help="definition name (needed for a .py file)")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    stages: Annotated[str | None, typer.Option(help=_STAGES_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object instead of the report")] = False,
    seed: Annotated[int | None, typer.Option(help="audit seed (default: a fresh secret one)")] = None,
    token_stats: Annotated[
        Path | None,
        typer.Option(
            "--token-stats",
            help="your token statistics (.npy or .safetensors: a histogram or a sample of ids) for the id probes",
        ),
    ] = None,
    token_stats_kind: Annotated[str, typer.Option("--token-stats-kind", help="auto, histogram or sample")] = "auto",
    problem_dir: Annotated[
        Path | None,
        typer.Option(
            "--problem-dir",
            help="a SOL-ExecBench definition folder (definition.json, workload.jsonl) to audit against, "
            "instead of the catalogue; without audit.json and oracle.py the generic probes apply",
        ),
    ] = None,
    catalogue_dir: Annotated[Path | None, _CATALOGUE_OPTION] = None,
    traces: Annotated[
        Path | None,
        typer.Option(
            "--traces", help="also write one SOL-ExecBench trace per evaluated workload to this file (JSON lines)"
        ),
    ] = None,
) -> None:
    """Audit a kernel: intake, static, benchmark, probes, canary, verdict."""
    err = Console(stderr=True)
    if problem_dir is not None and catalogue_dir is not None:
        raise _usage_error(err, "--problem-dir and --catalogue both name the problem's source: give one")
    # checked before the audit, which can take minutes, rather than after it
    if traces is not None and (traces.is_dir() or not traces.parent.is_dir()):
        raise _usage_error(err, f"--traces {traces}: needs a file path in an existing folder")
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
    chosen = _chosen_stages(err, stages)
    try:
        if problem_dir is not None:
            own = load_problem(problem_dir)
            # the folder's name is not looked at: the problem is the definition it holds, known by that name
            solution = read_submission(path, definition or own.name, None)
            solution = solution.for_definition(own.name, f"the definition in --problem-dir {problem_dir}")
            problem = own
        else:
            catalogue = open_catalogue(err, catalogue_dir)
            solution = read_submission(path, definition, catalogue)
            problem = catalogue.get(solution.definition)
    except (FormatError, OSError) as e:
        raise _usage_error(err, str(e)) from e
    if solution.spec.needs_gpu and not device.startswith("cuda"):  # refused before anything is loaded or run
        raise _usage_error(
            err,
            (
                f"spec.languages {list(solution.spec.languages)}: {', '.join(solution.spec.gpu_languages)} run only on an "
                f"NVIDIA GPU (CUDA), but this audit's devices are: {device} (--device); use --device cuda on a machine "
                "with one, or audit a pytorch or triton solution"
            ),
        )
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
    if traces is not None:
        _write_traces(
            err, traces, report, solution, list(problem.workloads("gpu" if device.startswith("cuda") else "cpu"))
        )
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json")))
    else:
        render(report, Console())
    raise typer.Exit(code=0 if report.verdict is Verdict.pass_ else 1)


def _write_traces(
    err: Console, target: Path, report: AuditReport, solution: Solution, workloads: list[Workload]
) -> None:
    """What SOL-ExecBench's evaluator would record for this audit (worker.traces), one JSON line per workload."""
    from worker.traces import to_jsonl, traces_of

    written = traces_of(report, solution, workloads)
    try:
        target.write_text(to_jsonl(written))
    except OSError as e:
        raise _usage_error(err, f"--traces {target}: {e.strerror or e}") from e
    # stderr: with --json, stdout holds the report alone
    err.print(
        f"traces: {len(written)} of {len(workloads)} workload(s) written to {escape(str(target))}"
        + ("" if len(written) == len(workloads) else " (the rest were not evaluated)"),
        highlight=False,
    )


problems_app = typer.Typer(
    help="The problem catalogue: list it (no command), or import a SOL-ExecBench dataset.", invoke_without_command=True
)
app.add_typer(problems_app, name="problems")


@problems_app.callback()
def problems(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    catalogue_dir: Annotated[Path | None, _CATALOGUE_OPTION] = None,
) -> None:
    """List the problem catalogue; `kaudit problems import PATH` adds a SOL-ExecBench dataset to one."""
    if ctx.invoked_subcommand is not None:
        return
    catalogue = open_catalogue(Console(stderr=True), catalogue_dir)
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "name": p.name,
                        "description": p.definition.description,
                        "inputs": list(p.definition.inputs),
                        "outputs": list(p.definition.outputs),
                        "probes": [s.name for s in p.spec.probes],
                        "examples": sorted(p.example_solutions()),
                    }
                    for p in catalogue
                ]
            )
        )
        return
    table = Table(title="kernel-audit problems")
    for col in ("name", "inputs", "outputs", "probes", "examples"):
        table.add_column(col, overflow="fold")
    for p in catalogue:
        table.add_row(
            p.name,
            ", ".join(p.definition.inputs),
            ", ".join(p.definition.outputs),
            str(len(p.spec.probes)),
            ", ".join(sorted(p.example_solutions())),
        )
    Console().print(table)


def _import_destination(err: Console, into: Path | None) -> Path:
    """--into, else KAUDIT_CATALOGUE_ROOT; never kernels/ by default (the curated catalogue ships in the package)."""
    if into is not None:
        if not _writable_folder(into):
            raise _usage_error(err, f"--into {into}: not a folder this user can write to")
        return into
    configured = _configured_catalogue_root(err)
    if configured is None:
        raise _usage_error(err, "no catalogue to import into: pass --into DIR, or set KAUDIT_CATALOGUE_ROOT")
    if not _writable_folder(configured):
        raise _usage_error(
            err,
            f"KAUDIT_CATALOGUE_ROOT {configured} is not a folder this user can write to: "
            "pass --into DIR, or set KAUDIT_CATALOGUE_ROOT to one",
        )
    return configured


def _overlaps(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def _hand_made_folders_replaced(root: Path, dest: Path) -> list[str]:
    """Definitions in the dataset whose name is already a folder in `dest` that no import wrote (no provenance.json):
    importing would delete it (a curated problem's audit.json, oracle.py and solutions)."""
    from worker.dataset_import import problem_folders, provenance_of

    clashes = []
    for folder in problem_folders(root):
        try:
            name = json.loads((folder / "definition.json").read_text()).get("name")
        except (OSError, ValueError, AttributeError):
            continue  # the import refuses it, and says why
        target = dest / name if isinstance(name, str) and name and "/" not in name else None
        if target is not None and target.is_dir() and provenance_of(target) is None:
            clashes.append(name)
    return sorted(set(clashes))


@problems_app.command("import")
def import_problems(
    path: Annotated[
        Path, typer.Argument(help="a SOL-ExecBench dataset tree (folders holding definition.json and workload.jsonl)")
    ],
    into: Annotated[
        Path | None, typer.Option("--into", help="the catalogue folder to import into (default: KAUDIT_CATALOGUE_ROOT)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the import report as one JSON object")] = False,
) -> None:
    """Import a SOL-ExecBench dataset tree into a catalogue folder, one folder per definition (blobs copied in).

    Exit 0: something was imported; 1: nothing was; 2: bad input. Imported references run sandboxed until reviewed."""
    from worker.dataset_import import import_dataset, problem_folders

    err = Console(stderr=True)
    if not path.is_dir():
        raise _usage_error(err, f"{path}: not a folder")
    dest = _import_destination(err, into)
    if _overlaps(path, dest):
        # an import deletes and rewrites dest/<name>: inside the dataset (or around it) that could be its own source
        raise _usage_error(err, f"the catalogue {dest} and the dataset {path} overlap: import into a folder outside it")
    clashes = _hand_made_folders_replaced(path, dest)
    if clashes:
        raise _usage_error(
            err,
            f"{dest} already holds problems that were not imported, which this import would "
            f"replace: {', '.join(clashes)}; import into another folder",
        )
    if not problem_folders(path.resolve()):
        err.print(f"nothing to import: no definition.json under {escape(str(path))}", highlight=False)
        raise typer.Exit(code=1)
    try:
        report = import_dataset(path, dest)
    except OSError as e:
        raise _usage_error(err, f"importing into {dest}: {e}") from e
    # a folder that does not load would make the whole catalogue unreadable to `kaudit audit --catalogue`
    broken: dict[str, str] = {}
    for p in report.imported:
        try:
            load_problem(Path(p.folder))
        except (FormatError, OSError) as e:
            broken[p.name] = str(e)
    if as_json:
        typer.echo(json.dumps({**report.model_dump(mode="json"), "does_not_load": broken, "into": str(dest)}))
    else:
        _render_import(report, broken, dest)
    raise typer.Exit(code=0 if report.imported else 1)


def _render_import(report: ImportReport, broken: dict[str, str], dest: Path) -> None:
    out = Console()
    if report.imported:
        table = Table(title=f"imported into {escape(str(dest))}")
        for col, justify in (("name", "left"), ("workloads", "right"), ("blobs", "right"), ("missing blobs", "left")):
            table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for p in report.imported:
            table.add_row(escape(p.name), str(p.workloads), str(p.blobs), escape(", ".join(p.missing_blobs)) or "-")
        out.print(table)
    if report.refused:
        table = Table(title="refused")
        table.add_column("folder", overflow="fold")
        table.add_column("why", overflow="fold")
        for folder, why in report.refused.items():
            table.add_row(escape(folder), escape(why))
        out.print(table)
    for name, why in broken.items():
        out.print(f"[yellow]warning:[/yellow] {escape(name)} was imported but does not load: {escape(why)}")
    out.print(
        f"{len(report.imported)} imported, {len(report.refused)} refused. Imported references run sandboxed "
        f"until reviewed (provenance.json). Audit against them: kaudit audit SOLUTION --catalogue "
        f"{escape(str(dest))}",
        highlight=False,
    )


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
    catalogue = load_catalogue(catalogue_root(Console(stderr=True), None))
    sizes = sorted({v for name in wanted for v in vocab_sizes(catalogue, name)})  # type: ignore[arg-type]
    warm_text_cache(sizes, lambda size, secs: typer.echo(f"text tokenised at {size} ids: {secs:.2f} s"))


@app.command()
def serve(
    data_dir: Annotated[Path, typer.Option(help="where the SQLite database and the broker's files live")] = Path(
        ".kaudit"
    ),
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    stages: Annotated[str | None, typer.Option(help=_STAGES_HELP)] = None,
    new_admin_key: Annotated[bool, typer.Option("--new-admin-key", help="print a fresh admin API key")] = False,
) -> None:
    """Start the service on this machine: API + worker, SQLite, no broker server; prints the URL and an admin key."""
    from app.serve import PortUnavailable
    from app.serve import serve as run_service

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise _usage_error(Console(stderr=True), f"--device must be cpu or cuda, not '{device}'")
    _chosen_stages(Console(stderr=True), stages, "--stages: ")
    try:
        run_service(data_dir, host, port, device=device, stages=stages, new_admin_key=new_admin_key)
    except PortUnavailable as e:
        raise _usage_error(Console(stderr=True), str(e)) from e


if __name__ == "__main__":
    app()
