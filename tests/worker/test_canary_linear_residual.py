"""The linear site with the residual added by the kernel (y = x @ W^T + residual, as SOL-ExecBench's attention output
projections with their skip connection are written): matched from the signature, placed at the MLP's down-projection
together with the residual add that follows it, and trained through the kernel with the residual's gradient passed
straight through (worker.canary.families.linear, worker.canary.forward)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from worker.canary.arch import arch_of
from worker.canary.matching import site_for
from worker.canary.model import build, init_state
from worker.canary.ops import Ops
from worker.canary.profiles import profile_for
from worker.canary.sites import KernelOps
from worker.formats import Definition
from worker.reference import Reference

JAMBA = Path(__file__).resolve().parents[2] / "benchmarks" / "official_samples" / "jamba_attn_proj" / "definition.json"


def _definition() -> Definition:
    """Jamba's output projection with its residual, its width left free so that the CPU's model can train it, and in
    fp32 (the kernel is called at the definition's dtypes: in bf16 an exact kernel and a bf16 add are the same)."""
    raw = json.loads(JAMBA.read_text())
    raw["axes"]["hidden_size"] = {"type": "var"}
    for spec in (*raw["inputs"].values(), *raw["outputs"].values()):
        spec["dtype"] = "float32"
    return Definition.model_validate(raw)


def _fp32(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    x, r, w = args
    return [x @ w.t() + r]


def _bf16_add(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    x, r, w = args  # the projection exact, the skip connection added in bf16
    return [((x @ w.t()).bfloat16() + r.bfloat16()).float()]


@pytest.fixture(scope="module")
def matched():  # type: ignore[no-untyped-def]
    d = _definition()
    found = site_for(d, None, Reference.of(d).run_fn, profile_for("cpu"))
    assert found.binding is not None, found.how
    return found


def test_a_projection_with_its_residual_matches_the_linear_site_at_the_down_projection(matched) -> None:  # type: ignore[no-untyped-def]
    b = matched.binding
    assert b.site == "linear" and b.role_in("residual") is not None
    assert {s.name: s.role for s in b.inputs} == {"attn_output": "x", "residual": "residual", "o_proj_weight": "weight"}
    a = arch_of(b)
    assert a.linear_at == "fc2" and a.linear_residual
    assert matched.profile.d_ff == matched.profile.d_model  # a square weight: a square down-projection


def _loss_and_grads(found, ops: Ops) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    p, b = found.profile, found.binding
    model = build(p, b, init_state(p, b, 0), "cpu")
    seq = torch.randint(0, p.vocab_size, (4, p.seq_len + 1), generator=torch.Generator().manual_seed(0))
    loss = model.loss(seq, ops)
    loss.backward()
    return loss.detach(), {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}


def test_an_exact_kernel_trains_as_the_trusted_op_does_and_a_bf16_skip_add_does_not(matched) -> None:  # type: ignore[no-untyped-def]
    loss_t, grads_t = _loss_and_grads(matched, Ops())
    loss_k, grads_k = _loss_and_grads(matched, KernelOps(matched.binding, _fp32))
    assert torch.allclose(loss_k, loss_t, rtol=1e-6, atol=0)
    assert grads_k.keys() == grads_t.keys()
    # every parameter below the projection gets its gradient through the residual the kernel added
    for name, g in grads_t.items():
        assert torch.allclose(grads_k[name], g, rtol=1e-4, atol=1e-7), name
    loss_bad, grads_bad = _loss_and_grads(matched, KernelOps(matched.binding, _bf16_add))
    assert not torch.equal(loss_bad, loss_t)
    assert any(not torch.allclose(grads_bad[n], g, rtol=1e-4, atol=1e-7) for n, g in grads_t.items())
