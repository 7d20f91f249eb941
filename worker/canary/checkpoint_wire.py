"""How the submission's process sends its checkpoint weights back: one float32 tensor [runs, checkpoints, parameters].

Each row is one checkpoint's weights, every parameter flattened and laid end to end in the sorted order of the
parameter names of the initial state (which both sides have). As one tensor in the reply's `outputs` it crosses
the trust boundary the way kernel outputs do: exported on the device where the sandbox can (worker.sandbox.device_share),
else as one spill file. Sent as dicts of tensors inside the reply frame, the GPU canary's 8 checkpoints
(370 MB) were pickled, piped and unpickled, seconds of every GPU canary.

The parent trusts nothing but the shape and dtype it checks here; the values are judged by its own held-out evaluation.
"""

from __future__ import annotations

import torch

State = dict[str, torch.Tensor]


def layout(init: State) -> list[tuple[str, torch.Size, int]]:
    """(name, shape, offset) of each parameter in a row, and so the row's length: the last offset plus its size."""
    out, offset = [], 0
    for name in sorted(init):
        out.append((name, init[name].shape, offset))
        offset += init[name].numel()
    return out


def row_length(init: State) -> int:
    return sum(t.numel() for t in init.values())


def pack(runs: list[dict[int, State]], steps: list[int], init: State, device: torch.device) -> torch.Tensor:
    """The weights of every run at every step in `steps`, as [len(runs), len(steps), row_length(init)] float32."""
    names = sorted(init)
    out = torch.empty((len(runs), len(steps), row_length(init)), dtype=torch.float32, device=device)
    for r, states in enumerate(runs):
        for s, step in enumerate(steps):
            state = states[step]
            torch.cat([state[n].detach().reshape(-1).float() for n in names], out=out[r, s])
    return out


def unpack(weights: object, runs: int, steps: list[int], init: State) -> list[dict[int, State]]:
    """The reply's tensor back into one {step: state} per run, as views of it; ValueError for anything but the exact
    shape and dtype that `pack` gives."""
    want = (runs, len(steps), row_length(init))
    if not isinstance(weights, torch.Tensor) or type(weights) is not torch.Tensor:
        raise ValueError("the checkpoint weights are not a tensor")
    if weights.dtype != torch.float32 or tuple(weights.shape) != want:
        raise ValueError(f"the checkpoint weights are {weights.dtype} {tuple(weights.shape)}, expected float32 {want}")
    parts = layout(init)
    out: list[dict[int, State]] = []
    for r in range(runs):
        per_step: dict[int, State] = {}
        for s, step in enumerate(steps):
            row = weights[r, s]
            per_step[step] = {name: row[off : off + shape.numel()].view(shape) for name, shape, off in parts}
        out.append(per_step)
    return out
