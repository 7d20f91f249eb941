"""GPU numbers for rmsnorm_forward, rmsnorm_backward, cross_entropy: probes at GPU axes, the benchmark judgement on GPU workloads, timings. Writes $OUT/gpu_*.json."""

import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from worker.catalogue import load_catalogue
from worker.inputs import build_case
from worker.numerics.dtypes import to_torch
from worker.numerics.error_metrics import measure_output
from worker.numerics.tolerance import compare_output
from worker.probes.distributions import build_probe_case
from worker.reference import Reference

dev = "cuda"
cat = load_catalogue()
OUT = Path(os.environ.get("OUT", "/tmp"))
results = []


def load(sol):
    d = Path(tempfile.mkdtemp())
    for s in sol.sources:
        (d / s.path).write_text(s.content)
    spec = importlib.util.spec_from_file_location(f"m_{sol.definition}_{sol.name}", d / sol.spec.entry_file)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return getattr(m, sol.spec.entry_function)


def to_dev(a):
    return a.to(dev) if isinstance(a, torch.Tensor) else a


def noncontig(t):
    wide = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def call(fn, d, args, shapes, noncontiguous=()):
    args = [noncontig(a) if n in noncontiguous else a for n, a in zip(d.inputs, args)]
    outs = [torch.full(shapes[o], float("nan"), dtype=to_torch(s.dtype), device=dev) for o, s in d.outputs.items()]
    fn(*args, *outs)
    torch.cuda.synchronize()
    return outs


def time_ms(fn, d, args, shapes, reps=20):
    outs = [torch.empty(shapes[o], dtype=to_torch(s.dtype), device=dev) for o, s in d.outputs.items()]
    for _ in range(3):
        fn(*args, *outs)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args, *outs)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


which = sys.argv[1:] or ["rmsnorm_forward", "rmsnorm_backward", "cross_entropy"]
for pname in which:
    p = cat.get(pname)
    d = p.definition
    orc = p.oracle()
    ref = Reference.of(d)
    sols = {n: load(s) for n, s in p.example_solutions().items()}
    # benchmark judgement + timing on the GPU workloads
    for w in p.workloads_gpu:
        case = build_case(d, ref, w, seed=5)
        args = [to_dev(a) for a in case.args(d)]
        refo = ref.run(args)
        exact = [e.to(dev) for e in orc(*args)]
        line = {"problem": pname, "workload": w.uuid, "solutions": {}}
        for n, fn in sols.items():
            outs = call(fn, d, args, case.output_shapes)
            entry = {}
            for (o, s), out, r, e in zip(d.outputs.items(), outs, refo, exact):
                c = compare_output(o, out, r, to_torch(s.dtype), p.spec.tolerance)
                m = measure_output(o, out, e, to_torch(s.dtype), p.spec.budgets[o])
                entry[o] = {
                    "bench_ok": c.ok,
                    "match": round(c.match_fraction or 0, 4),
                    "ratio": round(m.worst_ratio, 2),
                    "rel": m.rel_err,
                }
            entry["ms"] = round(time_ms(fn, d, args, case.output_shapes), 3)
            line["solutions"][n] = entry
        line["reference_ms"] = round(
            time_ms(
                lambda *a: [o.copy_(r) for o, r in zip(a[len(d.inputs) :], ref.run(list(a[: len(d.inputs)])))],  # noqa: B023 - timed in this iteration
                d,
                args,
                case.output_shapes,
                reps=5,
            ),
            3,
        )
        print(json.dumps(line), flush=True)
        results.append(line)
        del exact, refo, args, case
        torch.cuda.empty_cache()
    # probes at GPU axes
    for probe in p.spec.probes:
        t0 = time.time()
        case = build_probe_case(d, probe, "gpu", 1234)
        args = [to_dev(a) for a in case.args(d)]
        exact = [e.to(dev) for e in orc(*args)]
        line = {"problem": pname, "probe": probe.name, "axes": case.axes, "solutions": {}}
        for n, fn in sols.items():
            outs = call(fn, d, args, case.output_shapes, probe.noncontiguous)
            line["solutions"][n] = {
                o: round(measure_output(o, out, e, to_torch(s.dtype), p.spec.budgets[o]).worst_ratio, 2)
                for (o, s), out, e in zip(d.outputs.items(), outs, exact)
            }
        line["s"] = round(time.time() - t0, 1)
        print(json.dumps(line), flush=True)
        results.append(line)
        del exact, args, case
        torch.cuda.empty_cache()
(OUT / f"gpu_{'_'.join(which)}.json").write_text(json.dumps(results, indent=1))
