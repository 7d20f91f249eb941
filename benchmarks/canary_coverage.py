"""Which catalogue definitions get a training canary on the generic path (audit.json set aside), per op class.

    python benchmarks/canary_coverage.py --out benchmarks/results/canary_coverage_cpu [--profile cpu|gpu]

Also the SOL-ExecBench-style stand-in definitions of benchmarks/official_samples (written from SOL-ExecBench's
sample solutions' signatures; their model sizes are constant axes, as the benchmark's own definitions have them),
counted apart from the catalogue.

Every definition of the catalogue is matched the way an uploaded, uncurated definition is: from its signature and
its reference, confirmed by running the reference on an example (worker.canary.matching.site_for with no site
named). Each definition's op class comes from its `op_type`; the classes that a SOL-ExecBench LLM kernel can be
(linear and GEMM, MLP/GLU, attention, RoPE, norms, softmax, MoE routing, embedding, loss) are the ones a canary is
owed to. Writes OUT.json and OUT.md: one row per definition with its class, the site it matched or why none fits,
and the share of the owed definitions that have a canary. Matching runs the reference on the CPU: no GPU, no
training.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.canary.matching import site_for
from worker.canary.profiles import CanaryProfile, profile_for
from worker.catalogue import load_catalogue
from worker.formats.definition import Definition
from worker.formats.loaders import load_definition
from worker.reference import Reference

# op_type -> the op class a canary is owed to (None: an op a transformer's training step does not run as such)
OP_CLASSES: dict[str, str | None] = {
    "gemm": "linear / GEMM",
    "linear": "linear / GEMM",
    "mlp": "MLP gate-up (GLU)",
    "activation": "MLP gate-up (GLU)",
    "attention": "attention",
    "rope": "RoPE",
    "rmsnorm": "norm",
    "layernorm": "norm",
    "softmax": "softmax",
    "moe": "MoE routing",
    "embedding": "embedding",
    "cross_entropy": "loss",
    "scan": None,
    "scatter_reduce": None,
    "quantization": None,
    "sampling": None,
}
# the classes whose sites are matched from a signature (worker.canary.matching): every owed class, since the original
# sites (norm, embedding, loss) have families too; the headline's second share counts the definitions an uncurated
# upload of those classes could get a canary for
SIGNATURE_CLASSES = frozenset(
    {
        "linear / GEMM",
        "MLP gate-up (GLU)",
        "attention",
        "RoPE",
        "norm",
        "residual + norm",
        "softmax",
        "MoE routing",
        "embedding",
        "loss",
    }
)


def op_class(op_type: str | None, input_names: list[str]) -> str | None:
    cls = OP_CLASSES.get(op_type or "")
    if cls == "norm" and any("residual" in n.lower() for n in input_names):
        return "residual + norm"
    return cls


STAND_INS = Path(__file__).resolve().parent / "official_samples"


def _row(d: Definition, p: CanaryProfile, curated_site: str | None, source: str) -> dict[str, Any]:
    found = site_for(d, None, Reference.of(d).run_fn, p)
    return {
        "definition": d.name,
        "source": source,
        "op_type": d.op_type,
        "op_class": op_class(d.op_type, list(d.inputs)),
        "curated_site": curated_site,
        "generic_site": found.binding.site if found.binding else None,
        "layers": found.profile.n_layers if found.binding else None,
        "how": found.how,
    }


def rows(profile: str) -> list[dict[str, Any]]:
    p = profile_for(profile)
    out = [
        _row(problem.definition, p, problem.spec.canary.site if problem.spec.canary else None, "catalogue")
        for problem in load_catalogue()
    ]
    for path in sorted(STAND_INS.glob("*/definition.json")):
        out.append(_row(load_definition(path), p, None, f"stand-in {path.parent.name}"))
    return out


def markdown(meta: dict[str, Any], table: list[dict[str, Any]]) -> str:
    def share(rs: list[dict[str, Any]]) -> str:
        hit = sum(1 for r in rs if r["generic_site"])
        return f"{hit} of {len(rs)} ({100 * hit / max(len(rs), 1):.0f}%)"

    catalogue = [r for r in table if r["source"] == "catalogue"]
    stand_ins = [r for r in table if r["source"] != "catalogue"]
    owed = [r for r in catalogue if r["op_class"]]
    signature = [r for r in owed if r["op_class"] in SIGNATURE_CLASSES]
    lines = [
        f"# Canary coverage on the generic path ({meta['date']}, profile {meta['profile']})",
        "",
        f"With audit.json set aside, a canary for **{share(owed)}** of the catalogue's definitions of an LLM op class, "
        f"and for **{share(signature)}** of the classes whose sites are matched from a signature "
        f"({', '.join(sorted(SIGNATURE_CLASSES))}); {len(catalogue) - len(owed)} definitions are of no such class.",
    ]
    if stand_ins:
        lines += [
            "",
            f"SOL-ExecBench-style stand-ins (`benchmarks/official_samples`, model sizes as constant axes): a canary for "
            f"**{share([r for r in stand_ins if r['op_class']])}** of those of an LLM op class.",
        ]
    lines += [
        "",
        "| definition | source | op_type | class | curated site | generic site | layers | how |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(table, key=lambda r: (r["op_class"] is None, r["op_class"] or "", r["definition"])):
        how = r["how"] if len(r["how"]) < 260 else r["how"][:257] + "..."
        lines.append(
            f"| {r['definition']} | {r['source']} | {r['op_type']} | {r['op_class'] or '-'} "
            f"| {r['curated_site'] or '-'} | {r['generic_site'] or '**none**'} | {r['layers'] or '-'} "
            f"| {how.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="path without suffix: OUT.json and OUT.md")
    ap.add_argument("--profile", default="cpu", choices=("cpu", "gpu"), help="the canary profile matched at")
    args = ap.parse_args()
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "profile": args.profile}
    table = rows(args.profile)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": table}, indent=1))
    text = markdown(meta, table)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
