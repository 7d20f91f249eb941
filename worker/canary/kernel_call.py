"""One call of the kernel at a site: arguments by role in, outputs by role out, each checked against its shape."""

from __future__ import annotations

from typing import Any

import torch

from worker.canary.binding import Kernel, OpBinding


def call(
    b: OpBinding, kernel: Kernel, values: dict[str, Any], shapes: dict[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """`values`: every input role's value; `shapes`: every output role's shape (roles the definition lacks are
    ignored). The outputs come back by role, reshaped to those shapes."""
    shapes = {k: s for k, s in shapes.items() if b.role_out(k) is not None}
    args = b.args(values)
    # the kernel runs as written, at the definition's dtypes: the model's autocast (a GPU canary trains in bf16
    # autocast) would otherwise turn a kernel's own fp32 matmuls into bf16 ones, which neither SOL-ExecBench's harness
    # nor the fidelity check (outside autocast) runs
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    with torch.autocast(device, enabled=False):
        outs = kernel(args, b.out_specs(shapes))
    got = b.outputs_by_role(outs)
    for spec, o in zip(b.outputs, outs):
        want = tuple(shapes[spec.role])
        if tuple(o.shape) != want and o.numel() != int(torch.Size(want).numel()):
            raise ValueError(f"output '{spec.name}' has shape {tuple(o.shape)}, expected {want}")
    return {k: v.reshape(shapes[k]) for k, v in got.items()}
