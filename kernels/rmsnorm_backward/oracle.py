"""Trusted fp64 RMSNorm backward, computed from the same (already rounded) inputs, on their device."""

import torch


def _eps(eps):
    # eps is a float32 input: use the value the kernel and the reference see
    return float(torch.tensor(float(eps), dtype=torch.float32))


def run(input, weight, grad_output, eps):
    x = input.double()
    g = grad_output.double()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps(eps))
    xhat = x * rstd
    gw = g * weight.double()
    grad_input = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    grad_weight = (g * xhat).sum(0)
    return grad_input, grad_weight
