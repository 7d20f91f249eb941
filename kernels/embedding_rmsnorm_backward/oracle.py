"""Trusted fp64 embedding + RMSNorm backward, computed from the same (already rounded) inputs, on their device."""

import torch


def run(indices, weight, gamma, grad_output, eps):
    idx = indices.to(weight.device)
    h = weight.double()[idx]
    g = grad_output.double()
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + float(eps))
    xhat = h * rstd
    grad_gamma = (g * xhat).sum(0)
    gn = g * gamma.double()
    grad_h = rstd * (gn - xhat * (gn * xhat).mean(-1, keepdim=True))
    grad_weight = torch.zeros(weight.shape, dtype=torch.float64, device=weight.device)
    grad_weight.index_add_(0, idx, grad_h)
    return grad_weight, grad_gamma
