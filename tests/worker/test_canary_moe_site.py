"""The moe_routing site's parts: the kernel's routing in the model trains exactly as the trusted one (its backward is
the trusted weights' math at the experts it picked), a kernel's ids outside the experts are refused, and the
fidelity check judges expert ids as exact. Fast: no sandbox, no training."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from worker.canary import judge
from worker.canary.binding import OpBinding
from worker.canary.matching import site_for
from worker.canary.ops import Ops
from worker.canary.profiles import CPU
from worker.canary.sites import KernelOps
from worker.canary.train import reference_kernel
from worker.catalogue import load_catalogue
from worker.reference import Reference


def _binding() -> tuple[OpBinding, Any]:
    d = load_catalogue().get("moe_topk_routing").definition
    run = Reference.of(d).run_fn
    found = site_for(d, None, run, CPU)
    assert found.binding is not None, found.how
    return found.binding, reference_kernel(run)


def test_the_kernel_s_routing_trains_as_the_trusted_one() -> None:
    b, ref = _binding()
    # logits exact in bf16 (the definition's dtype): the kernel sees what the trusted op sees
    logits = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(0)).bfloat16().float()
    g = torch.randn(2, 16, CPU.top_k, generator=torch.Generator().manual_seed(1))
    got: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for ops in (Ops(), KernelOps(b, ref)):
        x = logits.clone().requires_grad_(True)
        w, ids = ops.moe_route(x, CPU.top_k, b.options.moe_renorm)
        (w * g).sum().backward()
        assert x.grad is not None
        got.append((w.detach(), ids, x.grad))
    (w0, i0, g0), (w1, i1, g1) = got
    assert torch.equal(i0, i1) and i1.dtype == torch.long and i1.shape == (2, 16, CPU.top_k)
    assert torch.allclose(w0, w1, rtol=1e-6, atol=0) and torch.allclose(w1.sum(-1), torch.ones(2, 16))
    assert torch.allclose(g0, g1, rtol=1e-5, atol=1e-7) and bool((g1 != 0).any())


def test_a_kernel_s_ids_outside_the_experts_are_refused() -> None:
    b, ref = _binding()

    def shifted(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        w, ids = ref(args, specs)
        return [w, ids + 8]

    with pytest.raises(ValueError, match=r"outside \[0, 8\)"):
        KernelOps(b, shifted).moe_route(torch.randn(4, 8), CPU.top_k, True)


def test_integer_outputs_are_judged_exact() -> None:
    exact = torch.tensor([[3, 1], [0, 7]])
    (same,) = judge.fidelity(0, "ids", exact.clone(), exact, None, None)
    assert same.ratio == 0.0 and same.ideal_rel_err == 0.0
    (off,) = judge.fidelity(0, "ids", torch.tensor([[1, 3], [0, 7]]), exact, None, None)
    assert math.isinf(off.ratio) and off.kernel_rel_err > 0
