"""Trusted fp64 rotary position embedding (NeoX layout), computed from the same (already rounded) inputs, on their device.

inv_freq, the angles position * inv_freq, cos/sin and the rotation all in fp64: the angle is off by about
1e-10 rad at position 1e6, far below one bf16 rounding of the output (4e-3 relative).
rope_theta is used as passed, the value the kernel and the reference see."""

import torch


def _rotate(x, cos, sin):
    x = x.double()
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def run(query, key, positions, rope_theta):
    head_dim = query.shape[-1]
    inv_freq = 1.0 / (float(rope_theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=query.device) / head_dim))
    angles = positions.to(query.device, torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    return _rotate(query, cos, sin), _rotate(key, cos, sin)
