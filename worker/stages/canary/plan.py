"""What every run of one canary shares, fixed before any of them trains, starting with where the op sits.

`choose_site` places the definition's op in the model: at the site audit.json names, else at the one its signature
and reference fit (worker.canary.matching), with the profile at the definition's constant sizes.

The reference, its nulls and the submission must train from the same seed, init and batches and be evaluated at the
same checkpoints on the same held-out text, or their losses cannot be paired. The plan also settles how the two
processes share the host: the submission's thread count and time limit, the parent's cores once the submission has
finished, and whether the parent's runs will be read back from worker.canary.parent_cache instead of trained.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from worker.canary import parent_cache, speed
from worker.canary.binding import Kernel, OpBinding
from worker.canary.data import CanaryText, canary_text
from worker.canary.matching import SiteMatch, site_for
from worker.canary.model import init_state
from worker.canary.profiles import CanaryProfile
from worker.canary.train import State, heldout_loss, reference_kernel
from worker.context import AuditContext
from worker.text.tokenizer import cache_dir


@dataclass
class Plan:
    profile: CanaryProfile
    binding: OpBinding
    device: str
    seed: int
    text: CanaryText  # the built-in text, or the user's token statistics
    init: State
    ref: Kernel
    steps: list[int]  # the checkpoints within the profile's steps: where every run is evaluated
    null_kinds: list[str]  # per optimiser, in the order the nulls are stacked
    cache_key: str | None  # None: no seed pool, so the parent's runs would never repeat
    child_threads: int
    child_timeout_s: float
    started: float  # perf_counter at the stage's start
    site_how: str = ""  # how the site was chosen (worker.canary.matching)
    timings: dict[str, float] = field(default_factory=dict)
    long_context: str = ""  # what the long-context fidelity check did, or why it did not run (evidence)
    stop: threading.Event = field(default_factory=threading.Event)  # set when the stage unwinds early
    child_done: threading.Event = field(default_factory=threading.Event)  # set when the submission's training returns

    @property
    def batches(self) -> torch.Tensor:
        return self.text.batches

    @property
    def heldout(self) -> torch.Tensor:
        return self.text.heldout

    @property
    def widen(self) -> tuple[threading.Event, int] | None:
        """On the CPU the submission's process holds p.threads cores while it trains, half as many as the parent's:
        once it has finished, the parent's training takes those cores too."""
        p = self.profile
        return (self.child_done, 2 * p.threads) if torch.device(self.device).type == "cpu" and p.threads else None

    def evaluate(self, states: dict[int, State]) -> list[float]:
        """The held-out loss at each checkpoint."""
        return [heldout_loss(self.profile, self.binding, states[s], self.heldout, self.device) for s in self.steps]


def choose_site(ctx: AuditContext, p: CanaryProfile) -> SiteMatch:
    """The op's site and the profile at its sizes, or (binding None) why it has none; raises CanaryUnsupported where
    the site audit.json names does not fit the definition."""
    spec = ctx.problem.spec.canary
    return site_for(ctx.problem.definition, spec.site if spec is not None else None, ctx.reference.run_fn, p)


def make_plan(ctx: AuditContext, p: CanaryProfile, binding: OpBinding, site_how: str = "") -> Plan:
    started = time.perf_counter()
    seed = ctx.derive_seed("canary")
    if p.seed_pool:
        seed = parent_cache.pooled_seed(seed, p.seed_pool)
    text = canary_text(p, seed, ctx.problem.token_stats)
    init = init_state(p, binding, seed)
    plan = Plan(
        profile=p,
        binding=binding,
        device=ctx.device,
        seed=seed,
        text=text,
        init=init,
        ref=reference_kernel(ctx.reference.run_fn),
        steps=[s for s in p.checkpoints if s <= p.steps],
        null_kinds=["rerun"] * p.repeat_runs + ["perturbed_1ulp"] * p.perturbed_runs,
        cache_key=None,
        child_threads=0,
        child_timeout_s=p.child_timeout_s,
        started=started,
        site_how=site_how,
    )
    if p.seed_pool:
        plan.cache_key = parent_cache.key(
            definition=ctx.problem.definition.model_dump_json(),
            binding=binding.model_dump_json(),
            profile=p.model_dump_json(),
            device=ctx.device,
            seed=seed,
            batches=text.batches,
            heldout=text.heldout,
            init=init,
        )
    _share_the_host(plan)
    return plan


def _share_the_host(plan: Plan) -> None:
    """The submission's thread count and time limit."""
    p = plan.profile
    # on the CPU the submission's process trains alone when the parent's runs will be read back: it gets the
    # parent's cores too (an entry unreadable after all costs only this; on a GPU the thread count is left as it is)
    hit = plan.cache_key is not None and parent_cache.has(cache_dir(), plan.cache_key)
    widen = plan.widen
    plan.child_threads = (widen[1] if hit and widen is not None else p.threads) or 0
    plan.timings["submission_threads"] = plan.child_threads
    # on the CPU the submission's training limit follows how fast this host is right now (worker.canary.speed): a
    # correct kernel on a busy host must not end inconclusive for the auditor's own reasons
    if torch.device(plan.device).type == "cpu":
        factor = speed.slowdown()
        plan.child_timeout_s = round(p.child_timeout_s * factor, 1)
        plan.timings["host_slowdown"] = round(factor, 2)
    plan.timings["submission_timeout_s"] = plan.child_timeout_s
