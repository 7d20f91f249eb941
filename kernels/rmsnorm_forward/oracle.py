"""Trusted fp64 RMSNorm forward, computed from the same (already rounded) inputs, on their device."""

import torch


def _eps(eps):
    # eps is a float32 input: use the value the kernel and the reference see
    return float(torch.tensor(float(eps), dtype=torch.float32))


def run(input, weight, eps):
    x = input.double()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps(eps))
    return (x * rstd * weight.double(),)
