"""Real text for the canary: the probes' corpus and tokenizer, a train/held-out split, seeded batches."""

from __future__ import annotations

import torch

from worker.text import corpus_token_ids


def split(vocab_size: int, heldout_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) token streams: the held-out text is the corpus's last `heldout_fraction`."""
    ids = corpus_token_ids(vocab_size)
    cut = int(len(ids) * (1.0 - heldout_fraction))
    return ids[:cut], ids[cut:]


def windows(stream: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    return stream[starts.unsqueeze(-1) + torch.arange(length)]


def draw_batches(train: torch.Tensor, steps: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """[steps, batch, seq_len+1] int32 windows of the train stream, the same for every run of one audit."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(train) - seq_len - 1, (steps, batch_size), generator=gen)
    return windows(train, starts, seq_len + 1).to(torch.int32)


def heldout_set(heldout: torch.Tensor, n_sequences: int, seq_len: int) -> torch.Tensor:
    """[n, seq_len+1] evenly spaced windows of the held-out stream (fixed: not seeded)."""
    span = len(heldout) - seq_len - 1
    starts = torch.linspace(0, span, n_sequences).long()
    return windows(heldout, starts, seq_len + 1)
