"""Trusted fp64 LayerNorm forward, computed from the same (already rounded) inputs, on their device.

Two-pass statistics in fp64: the mean, then the mean of squared deviations from it, so a row whose
mean dwarfs its spread keeps its variance exactly (what a one-pass E[x^2] - E[x]^2 loses)."""

import torch


def _eps(eps):
    # eps is a float32 input: use the value the kernel and the reference see
    return float(torch.tensor(float(eps), dtype=torch.float32))


def run(input, weight, bias, eps):
    x = input.double()
    d = x - x.mean(-1, keepdim=True)
    var = (d * d).mean(-1, keepdim=True)
    return (d * torch.rsqrt(var + _eps(eps)) * weight.double() + bias.double(),)
