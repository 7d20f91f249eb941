"""How the submission's process sends its checkpoint weights back: float32 pieces of one row per run and checkpoint.

A row is one checkpoint's weights, every parameter flattened and laid end to end in the sorted order of the parameter
names of the initial state (which both sides have). Each row goes as `pieces_per_row` 1-D tensors of at most
`piece` elements, run after run, checkpoint after checkpoint, in the reply's `outputs`. They cross the trust boundary
the way kernel outputs do: exported on the device where the sandbox can (worker.sandbox.device_share), else each as
its own spill file. Sent as dicts of tensors inside the reply frame, the GPU canary's 8 checkpoints (370 MB) were
pickled, piped and unpickled, seconds of every GPU canary.

Why pieces, not one tensor [runs, checkpoints, parameters]: at a definition's own width the model is large
(SOL-ExecBench's RMSNorm at hidden size 4096: 436M parameters, 14 GB for 2 runs x 4 checkpoints), one spill file
that size is past the sandbox's file-size limit (worker.sandbox.isolation: the child died of EFBIG on the H100), and
packing it whole held every checkpoint twice. A piece is at most 1 GiB, and `pack` lets go of each checkpoint once
its row is packed.

The parent trusts nothing but the count, shapes and dtype it checks here; the values are judged by its own held-out
evaluation.
"""

from __future__ import annotations

import math

import torch

State = dict[str, torch.Tensor]

PIECE_ELEMENTS = 1 << 28  # 1 GiB of float32: well under the sandbox's 2 GiB file-size limit


def layout(init: State) -> list[tuple[str, torch.Size, int]]:
    """(name, shape, offset) of each parameter in a row, and so the row's length: the last offset plus its size."""
    out, offset = [], 0
    for name in sorted(init):
        out.append((name, init[name].shape, offset))
        offset += init[name].numel()
    return out


def row_length(init: State) -> int:
    return sum(t.numel() for t in init.values())


def pieces_per_row(init: State, piece: int) -> int:
    return max(1, math.ceil(row_length(init) / piece))


def pack(
    runs: list[dict[int, State]], steps: list[int], init: State, device: torch.device, piece: int = PIECE_ELEMENTS
) -> list[torch.Tensor]:
    """The weights of every run at every step in `steps`, as pieces of rows (see the module's docstring). Each
    checkpoint is removed from its run's dict once packed: the caller hands its checkpoints over."""
    names = sorted(init)
    n = row_length(init)
    out: list[torch.Tensor] = []
    for states in runs:
        for step in steps:
            state = states.pop(step)
            row = torch.empty(n, dtype=torch.float32, device=device)
            torch.cat([state[k].detach().reshape(-1).float() for k in names], out=row)
            del state
            out.extend(row[i : i + piece].clone() if n > piece else row for i in range(0, n, piece))
            del row
    return out


def unpack(
    weights: object, runs: int, steps: list[int], init: State, piece: int = PIECE_ELEMENTS
) -> list[dict[int, State]]:
    """The reply's pieces back into one {step: state} per run; ValueError for anything but exactly the pieces that
    `pack` gives: their count, each one a plain float32 1-D tensor of its exact length."""
    n, per_row = row_length(init), pieces_per_row(init, piece)
    lengths = [min(piece, n - i) for i in range(0, n, piece)] or [0]
    if not isinstance(weights, list):
        raise ValueError("the checkpoint weights are not a list of tensors")
    if len(weights) != runs * len(steps) * per_row:
        raise ValueError(
            f"{len(weights)} pieces of checkpoint weights, expected {runs * len(steps) * per_row} "
            f"({runs} runs x {len(steps)} checkpoints x {per_row} per row)"
        )
    for i, w in enumerate(weights):
        want = (lengths[i % per_row],)
        if not isinstance(w, torch.Tensor) or type(w) is not torch.Tensor:
            raise ValueError(f"piece {i} of the checkpoint weights is not a tensor")
        if w.dtype != torch.float32 or tuple(w.shape) != want:
            raise ValueError(
                f"piece {i} of the checkpoint weights is {w.dtype} {tuple(w.shape)}, expected float32 {want}"
            )
    parts = layout(init)
    out: list[dict[int, State]] = []
    for r in range(runs):
        per_step: dict[int, State] = {}
        for s, step in enumerate(steps):
            first = (r * len(steps) + s) * per_row
            row = weights[first : first + per_row]
            per_step[step] = {name: _parameter(row, off, shape, piece) for name, shape, off in parts}
        out.append(per_step)
    return out


def _parameter(row: list[torch.Tensor], offset: int, shape: torch.Size, piece: int) -> torch.Tensor:
    """One parameter of a row: a view into the piece that holds it, or, where it straddles pieces, their parts joined
    on the first one's device. Joining whole rows held every checkpoint twice in the parent (14 GB more at width
    4096), and the pieces of one row need not share a device: on a full card a piece the child cannot export on the
    device, or the parent cannot copy there, crosses through the host (worker.sandbox.device_share)."""
    n = shape.numel()
    first, last = offset // piece, (offset + max(n, 1) - 1) // piece
    if first == last:
        start = offset - first * piece
        return row[first][start : start + n].view(shape)
    device = row[first].device
    parts = [
        row[i][max(offset - i * piece, 0) : min(offset + n - i * piece, piece)].to(device)
        for i in range(first, last + 1)
    ]
    return torch.cat(parts).view(shape)
