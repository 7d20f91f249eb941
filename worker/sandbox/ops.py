"""The sandbox's own ops, served in the child (worker.sandbox.child): start-up, loading the submission, calling and
timing it, an uploaded definition's custom inputs. Each takes its validated request model and returns its reply
model (worker.sandbox.protocol).

Everything here runs in the submitter's process, so nothing here decides a verdict: it moves tensors to the device,
calls the kernel and sends tensors back.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from worker import generated
from worker.numerics import timing
from worker.sandbox import device_share, harness
from worker.sandbox.harness import HarnessState
from worker.sandbox.protocol import (
    CallReply,
    CallRequest,
    CustomInputsReply,
    CustomInputsRequest,
    HelloReply,
    HelloRequest,
    LoadReply,
    LoadRequest,
    TimeReply,
    TimeRequest,
)
from worker.sandbox.registry import op


@op(HelloRequest)
def hello(state: HarnessState, request: HelloRequest) -> HelloReply:
    state.device = torch.device(request.device)
    shared = False
    if state.device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=state.device)
        if request.device_share:
            try:
                state.exporter = device_share.Exporter(state.device)
                shared = True
            except Exception:  # noqa: BLE001 - no export here: outputs go through the host instead
                state.exporter = None
    return HelloReply(pid=os.getpid(), torch=str(torch.__version__), device_share=shared)


@op(LoadRequest)
def load(state: HarnessState, request: LoadRequest) -> LoadReply:
    root = Path.cwd() / "solution"
    written: set[Path] = set()
    for src in request.sources:
        path = src.path
        # the parent sends the canonical paths the static stage scanned; any other spelling ('k.py/', './k.py')
        # or a second file at one path would write over a scanned file, so it is refused rather than written
        if not path or str(PurePosixPath(path)) != path or path.startswith("/") or "\\" in path:
            raise ValueError(f"source path is not in canonical form: {path!r}")
        target = (root / path).resolve()
        if root.resolve() not in target.parents:
            raise ValueError(f"source path escapes the solution folder: {path}")
        if target in written:
            raise ValueError(f"two sources name one file: {path}")
        written.add(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(src.content)
    sys.path.insert(0, str(root))
    if state.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        _watch_bf16(state, request)
    if request.artifact is not None:  # a C++ solution: its built extension, exactly the bytes the build produced
        from worker.build.loader import load_extension

        so = root / "benchmark_kernel.so"
        so.write_bytes(request.artifact.data)
        state.fn = load_extension(so, request.artifact.sha256, request.artifact.entry_symbol)
        state.module = None
        state.dps = request.dps
        return LoadReply()
    entry = root / request.entry_file
    spec = importlib.util.spec_from_file_location(Path(request.entry_file).stem, entry)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, request.entry_function, None)
    if not callable(fn):
        raise AttributeError(f"entry point '{request.entry_function}' is not a function in {request.entry_file}")
    state.fn = fn
    state.module = module
    state.dps = request.dps
    return LoadReply()


def _watch_bf16(state: HarnessState, request: LoadRequest) -> None:
    """Before a solution that names Triton runs under the CPU interpreter: note any bf16 arithmetic it does there."""
    if any("triton" in src.content for src in request.sources):
        from worker.sandbox.interpreter_bf16 import Bf16Watch

        watch = Bf16Watch()
        if watch.install():
            state.bf16_watch = watch


@op(CustomInputsRequest)
def custom_inputs(state: HarnessState, request: CustomInputsRequest) -> CustomInputsReply:
    """An uploaded definition's `custom_inputs_entrypoint`, called here like its reference: its inputs come back
    as tensors only (the parent reads them weights-only)."""
    if state.module is None:
        raise RuntimeError("no module loaded")
    fn = getattr(state.module, request.entrypoint, None)
    if not callable(fn):
        raise AttributeError(f"custom inputs entry point '{request.entrypoint}' is not a function")
    torch.manual_seed(request.seed)
    made = fn(dict(request.axes_and_scalars), torch.device("cpu"))
    if not isinstance(made, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in made.items()
    ):
        raise TypeError("custom inputs must be a dict of input name -> torch.Tensor")
    return CustomInputsReply(inputs={k: _plain(v) for k, v in made.items()})


def _plain(t: Any, state: HarnessState | None = None) -> torch.Tensor:
    """A plain tensor of the kernel's output: on the host, or, where the parent takes device outputs
    (`state.exporter`), still on the device (the reply's export copies it, see worker.sandbox.device_share)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"the kernel returned a {type(t).__name__}, not a torch.Tensor")
    # a tensor subclass could defer work or lie about its values: materialise a plain copy
    out = torch.Tensor.as_subclass(t.detach(), torch.Tensor)
    if state is not None and state.exporter is not None and out.device.type == "cuda":
        return out.contiguous()
    return out.to("cpu", copy=True).contiguous()


@op(CallRequest)
def call(state: HarnessState, request: CallRequest) -> CallReply:
    args = harness.prepare_args(state, request.args, request.noncontiguous)
    # inputs made here from recipes go back as digests, before (what was made) and after the call (mutation)
    made = [i for i, a in enumerate(request.args) if generated.is_wire(a)]
    made_digests = {i: generated.digest(args[i]) for i in made}
    outs = harness.alloc_outputs(state, request.outputs, request.poison)
    if request.reorder is not None:  # an uploaded reference re-run with its reductions in another honest order
        from worker.numerics.reorder import STYLES, Reorder

        if request.reorder not in STYLES:
            raise ValueError(f"unknown reorder style {request.reorder!r}")
        with Reorder(request.reorder):
            results = harness.invoke(state, args, outs)
    else:
        results = harness.invoke(state, args, outs)
    state.sync()
    exact_types = [type(r) is torch.Tensor for r in results]
    # `digest_after`: every tensor input comes back as a digest, not a copy (the parent compares it with its own)
    after = [
        generated.digest_wire(a)
        if i in made_digests or (request.digest_after and isinstance(a, torch.Tensor))
        else _plain(a)
        if isinstance(a, torch.Tensor)
        else a
        for i, a in enumerate(args)
    ]
    return CallReply(
        tampered=state.tampered(),
        outputs=[_plain(r, state) for r in results],
        exact_tensor_types=exact_types,
        args_after=after,
        made_digests=[made_digests[i] for i in made],
        interpreter_bf16=state.bf16_watch.op if state.bf16_watch is not None else None,
    )


@op(TimeRequest)
def time_calls(state: HarnessState, request: TimeRequest) -> TimeReply:
    """`reps` timed calls into fresh poisoned outputs (protocol.TimeRequest says how the input sets are laid out);
    the outputs of the calls listed in `check` go back for the parent to judge."""
    flat = request.args
    n_args = request.n_args if request.n_args is not None else len(flat)
    # every input set is made (recipes) or placed on the device before the first timed call
    cases = (
        [harness.prepare_args(state, flat[i : i + n_args], request.noncontiguous) for i in range(0, len(flat), n_args)]
        if n_args
        else [[]]
    )
    check = set(request.check)
    # the checked calls' inputs made here from recipes, as digests (the parent compares them with its own)
    made_digests = [
        [generated.digest(cases[c][j]) for j in range(n_args) if generated.is_wire(flat[c * n_args + j])]
        for c in sorted(check)
        if n_args and c < len(cases)
    ]
    cfg = timing.TimingConfig(warmup=request.warmup, reps=request.reps, flush_l2=request.flush_l2)
    if 1 < len(cases) < cfg.reps:
        raise ValueError(f"{cfg.reps} timed calls need as many input sets, got {len(cases)}")
    # warm-up calls run on an input set of their own when one is given (so no timed call repeats one)
    spare = cases[cfg.reps] if len(cases) > cfg.reps else cases[0]
    current: list[list[torch.Tensor]] = [[]]
    kept: dict[int, list[Any]] = {}

    def prepare(i: int) -> None:
        current[0] = harness.alloc_outputs(state, request.outputs, request.poison)

    def call_once(i: int) -> None:
        results = harness.invoke(state, spare if i < 0 else cases[i] if len(cases) > 1 else cases[0], current[0])
        if i in check:
            kept[i] = results

    sample = timing.measure(
        call_once,
        state.device,
        cfg,
        prepare=prepare,
        clock=state.perf_counter,
        event=state.pristine["torch.cuda.Event"],
        elapsed=state.pristine["torch.cuda.Event.elapsed_time"],
    )
    return TimeReply(
        times_ms=sample.times_ms,
        clock=sample.clock,  # type: ignore[arg-type]  # TimingSample's clock is one of the two the reply allows
        host_times_ms=sample.host_times_ms,
        outputs=[_plain(r, state) for i in sorted(kept) for r in kept[i]],
        checked=sorted(kept),
        tampered=state.tampered(),
        made_digests=made_digests,
    )
