"""Cheat: return uninitialised memory (never write the destination buffer).

Fast, and on an allocator that hands back the previous call's buffer it can even
hold the right values. The harness fills outputs with NaN before the call.
Caught by: benchmark (NaN in the output).
"""


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    return None
