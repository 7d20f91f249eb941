"""The generic oracle: a definition's own reference promoted to fp64, with its fallbacks reported."""

from __future__ import annotations

import pytest
import torch

from worker.formats import Definition
from worker.generic.promote import GenericOracle, run_promoted
from worker.reference import Reference


def _definition(reference: str) -> Definition:
    return Definition.model_validate(
        {
            "name": "promote_fixture",
            "axes": {"rows": {"type": "var"}, "cols": {"type": "var"}},
            "inputs": {
                "x": {"shape": ["rows", "cols"], "dtype": "bfloat16"},
                "w": {"shape": ["cols"], "dtype": "bfloat16"},
            },
            "outputs": {"y": {"shape": ["rows"], "dtype": "bfloat16"}},
            "reference": reference,
        }
    )


CASTS_TO_BF16 = """import torch


def run(x, w):
    # a reference that rounds to bf16 inside: the product, then a bf16 accumulator, then a float32 constant
    p = (x.float() * w.float()).to(torch.bfloat16)
    acc = torch.zeros(x.shape[0], dtype=torch.bfloat16)
    for j in range(p.shape[1]):
        acc = acc + p[:, j]
    third = torch.tensor(1.0) / 3
    return (acc.float() * third).half().bfloat16()
"""


def _inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 300, generator=g).to(torch.bfloat16), torch.randn(300, generator=g).to(torch.bfloat16)]


def test_reference_that_casts_to_bf16_inside_still_yields_fp64() -> None:
    x, w = _inputs()
    oracle = GenericOracle(Reference.of(_definition(CASTS_TO_BF16)))
    (y,) = oracle(x, w)
    exact = (x.double() * w.double()).sum(-1) / 3
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, exact, rtol=1e-12, atol=1e-12)
    # the reference at its own precision is far from that: the promotion did change the arithmetic
    own = Reference.of(_definition(CASTS_TO_BF16)).run([x, w])[0].double()
    assert float((own - exact).abs().max()) > 1e3 * float((y - exact).abs().max())
    summary = oracle.summary()
    assert summary["precision"] == "fp64" and summary["partial"] == {} and "fallback_reason" not in summary


def test_inputs_are_not_modified_and_integer_outputs_stay_integer() -> None:
    x, w = _inputs(1)
    before = x.clone()
    outs, lowered, selects = run_promoted(
        lambda a, b: (a.float() @ b.float(), torch.argmax(a.float(), -1)), [x, w], torch.float64
    )
    assert torch.equal(x, before) and x.dtype == torch.bfloat16
    assert outs[0].dtype == torch.float64 and outs[1].dtype == torch.int64 and lowered == {}
    assert selects  # argmax breaks ties per device: a GPU oracle must rerun this on the CPU


def test_reference_that_refuses_promotion_is_reported_and_run_at_its_own_precision() -> None:
    insists = """import torch


def run(x, w):
    if x.dtype != torch.bfloat16:
        raise TypeError(f"this reference only takes bf16, got {x.dtype}")
    return ((x.float() * w.float()).sum(-1)).to(torch.bfloat16)
"""
    x, w = _inputs(2)
    oracle = GenericOracle(Reference.of(_definition(insists)))
    (y,) = oracle(x, w)
    assert y.dtype == torch.bfloat16  # the reference's own result, not fp64
    assert torch.equal(y, ((x.float() * w.float()).sum(-1)).to(torch.bfloat16))
    summary = oracle.summary()
    assert summary["precision"] == "reference"
    assert "fp64 promotion raised TypeError" in summary["fallback_reason"]
    assert "fp32 promotion raised TypeError" in summary["fallback_reason"]
    assert "budgets are relative to it" in summary["note"]


MATMUL = """import torch


def run(x, w):
    return (x.float() * w.float()).sum(-1).to(torch.bfloat16)
"""

TOPK = """import torch


def run(x, w):
    v, i = torch.topk(x.float() * w.float(), 2, dim=-1)
    return torch.zeros(x.shape[0], dtype=torch.bfloat16) + v.sum(-1).to(torch.bfloat16) + i.sum(-1).to(torch.bfloat16)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_oracle_runs_there_unless_the_reference_selects_by_order() -> None:
    x, w = _inputs(3)
    on_gpu = GenericOracle(Reference.of(_definition(MATMUL)), device="cuda")
    (y,) = on_gpu(x, w)
    assert y.device.type == "cuda" and y.dtype == torch.float64 and on_gpu.runs[-1].device.startswith("cuda")
    (cpu_y,) = GenericOracle(Reference.of(_definition(MATMUL)))(x, w)
    assert torch.allclose(y.cpu(), cpu_y, rtol=1e-12, atol=0)
    selecting = GenericOracle(Reference.of(_definition(TOPK)), device="cuda")
    (z,) = selecting(x, w)
    assert z.device.type == "cpu" and selecting.runs[-1].device == "cpu" and selecting.device.type == "cpu"


def test_an_untrusted_reference_never_runs_its_oracle_on_the_gpu() -> None:
    class Uploaded:
        trusted = False
        run_fn = staticmethod(lambda x, w: x)

    assert GenericOracle(Uploaded(), device="cuda:0").device.type == "cpu"  # type: ignore[arg-type]


def test_factories_inside_the_reference_are_made_on_the_oracles_device() -> None:
    # "meta" stands in for the GPU here: a factory left on the CPU would not mix with a meta input
    x = torch.ones(4, 3, device="meta", dtype=torch.bfloat16)
    outs, _, selects = run_promoted(
        lambda a: a.float() + torch.zeros(a.shape[1]), [x], torch.float64, torch.device("meta")
    )
    assert outs[0].device.type == "meta" and outs[0].dtype == torch.float64 and not selects
