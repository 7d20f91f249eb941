"""Trusted fp64 cross-entropy (mean over non-ignored tokens) and its gradient.

Computed in row chunks on the inputs' device so that a 16k x 128k batch does not need
several fp64 copies of the logits at once; results stay on that device.
"""

import torch

_CHUNK_ELEMENTS = 1 << 26


def run(logits, targets, ignore_index):
    n_tokens, vocab = logits.shape
    valid = targets != ignore_index
    count = max(int(valid.sum()), 1)
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    scale = valid.double() / count
    grad = torch.empty((n_tokens, vocab), dtype=torch.float64, device=logits.device)
    loss = torch.zeros((), dtype=torch.float64, device=logits.device)
    rows = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    for r0 in range(0, n_tokens, rows):
        x = logits[r0 : r0 + rows].double()
        t = safe[r0 : r0 + rows]
        lse = torch.logsumexp(x, dim=-1)
        picked = x.gather(1, t[:, None]).squeeze(1)
        loss += ((lse - picked) * valid[r0 : r0 + rows]).sum()
        p = torch.exp(x - lse[:, None])
        p.scatter_add_(1, t[:, None], torch.full_like(picked[:, None], -1.0))
        p *= scale[r0 : r0 + rows, None]
        grad[r0 : r0 + rows] = p
    return loss / count, grad
