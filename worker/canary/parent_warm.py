"""Warm the audit worker's own process up before its first canary: the trusted side's training at every site.

The worker's process trains the reference next to the submission's process (worker.stages.canary). Its first
training pays for first use: the device's kernels loaded on first launch, cuBLAS and attention set up for the
stacked model's shapes, the optimisers' code paths. worker.canary.warm does the same for a sandbox child.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from worker.canary.binding import CanaryUnsupported, OpBinding
from worker.canary.matching import site_for
from worker.canary.model import init_state
from worker.canary.profiles import CanaryProfile, profile_for
from worker.canary.stacked import parent_thread, train_stacked
from worker.canary.train import heldout_loss, reference_kernel
from worker.catalogue import Catalogue
from worker.numerics import gpu_memory
from worker.numerics.device_slots import SlotSettings, device_slot
from worker.reference import Reference


def warm_parent(device: torch.device, catalogue: Catalogue, steps: int = 2) -> dict[str, float]:
    """The audit worker's side of the canary, once per site that a trusted catalogue problem places its op at
    (named in its audit.json or matched from its signature, worker.canary.matching):
    `steps` stacked steps of the problem's reference with each optimiser, and one held-out evaluation.

    Measured on the H200 (2026-12-03, benchmarks/results/h200-2026-12-03/session10): the parent's first canary in a
    worker process trained cross-entropy's two runs in 7.8 s (first step 1.3 s), against 3.0 s (0.08 s) in a
    process that had trained before. Only trusted code runs (curated references, random weights and tokens);
    nothing of it is kept. Returns seconds per site; a site whose training ran out of device memory is left out
    (its first audit pays the first use), and each site trains in one of the device's canary slots
    (worker.numerics.device_slots), so that eight workers starting at once do not train every site together."""
    p = profile_for("gpu" if device.type == "cuda" else "cpu")
    took: dict[str, float] = {}
    threads = torch.get_num_threads()  # parent_thread sets this thread's count for the CPU profile: put it back
    try:
        _warm_sites(p, device, catalogue, steps, took)
    finally:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # what the warm-up reserved goes back to the card, for the audits of every process
    return took


def _warm_sites(
    p: CanaryProfile, device: torch.device, catalogue: Catalogue, steps: int, took: dict[str, float]
) -> None:
    for problem in catalogue:
        if not problem.reference_trusted:
            continue
        spec = problem.spec.canary
        ref_fn = Reference.of(problem.definition).run_fn
        try:
            found = site_for(problem.definition, spec.site if spec is not None else None, ref_fn, p)
        except CanaryUnsupported:
            continue
        binding = found.binding
        if binding is None or binding.site in took:
            continue
        with device_slot(str(device), "canary", SlotSettings.from_env().canary_slots):
            t0 = time.perf_counter()
            try:
                _warm_site(found.profile, binding, ref_fn, device, steps)
            except torch.OutOfMemoryError:
                continue  # the neighbours' audits hold the card: a warm-up is never worth an audit's memory
            finally:
                gpu_memory.release(str(device))
            took[binding.site] = round(time.perf_counter() - t0, 2)


def _warm_site(
    q: CanaryProfile, binding: OpBinding, ref_fn: Callable[..., Any], device: torch.device, steps: int
) -> None:
    """`steps` stacked steps of the reference at `q` (the profile at the definition's constant sizes), each optimiser,
    and one held-out evaluation."""
    batches = torch.randint(0, q.vocab_size, (steps, q.batch_size, q.seq_len + 1))
    held = torch.randint(0, q.vocab_size, (2, q.seq_len + 1))
    init = init_state(q, binding, 0)
    with parent_thread(device, q.threads):
        outs = train_stacked(
            q,
            binding,
            [reference_kernel(ref_fn)] * len(q.optimizers),
            init,
            batches,
            list(q.optimizers),
            device,
            (steps,),
        )
        heldout_loss(q, binding, outs[0].checkpoints[steps], held, device)
