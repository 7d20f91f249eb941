"""Text for the canary: the probes' corpus and tokenizer (or the user's token statistics), a train/held-out
split, seeded batches.

`canary_text` is what the stage calls: with no token statistics it is the built-in text as `split`,
`draw_batches` and `heldout_set` give it; with a user's sample of ids, the same contiguous windows over their
ids (train = the first 95%, held-out = the last 5%); with a user's histogram, i.i.d. draws from it. Ids at or
above the canary model's vocabulary are folded into it (id % vocab_size) and counted in the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from worker.text import corpus_token_ids

if TYPE_CHECKING:
    from worker.canary.profiles import CanaryProfile
    from worker.probes.token_stats import LoadedTokenStats

# the held-out draws from a histogram use their own fixed generator (the built-in held-out text is fixed too)
HELDOUT_SEED = 0x5EED_4E1D


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


@dataclass(frozen=True)
class CanaryText:
    """The batches every run of one audit trains on, the held-out set it is evaluated on, and where they came from."""

    batches: torch.Tensor  # [steps, batch, seq_len+1] int32
    heldout: torch.Tensor  # [heldout_sequences, seq_len+1]
    evidence: dict[str, Any] = field(default_factory=dict)
    # [1, fidelity_context+1] int32: one longer window of the training text, for the long-context fidelity check
    long_window: torch.Tensor | None = None


def long_window(train: torch.Tensor, p: CanaryProfile, seed: int) -> torch.Tensor | None:
    """One window of `p.fidelity_context` + 1 training ids (None where the profile checks no long context)."""
    if p.fidelity_context <= 0:
        return None
    return draw_batches(_wrapped(train, p.fidelity_context + 2), 1, 1, p.fidelity_context, seed + 1)[0]


def canary_text(p: CanaryProfile, seed: int, stats: LoadedTokenStats | None = None) -> CanaryText:
    """The canary's data: the built-in text, or the user's token statistics when the audit has them."""
    if stats is None:
        train, held = split(p.vocab_size, p.heldout_fraction)
        return CanaryText(
            batches=draw_batches(train, p.steps, p.batch_size, p.seq_len, seed),
            heldout=heldout_set(held, p.heldout_sequences, p.seq_len),
            long_window=long_window(train, p, seed),
            evidence={
                "user_statistics": False,
                "source": f"built-in text: the King James Bible, byte-level BPE with {p.vocab_size} ids",
                "train_ids": len(train),
                "heldout_ids": len(held),
            },
        )
    if stats.kind == "sample":
        return _from_sample(p, seed, stats)
    return _from_histogram(p, seed, stats)


def _user_evidence(stats: LoadedTokenStats, vocab_size: int, folded: int, of: int) -> dict[str, Any]:
    return {
        "user_statistics": True,
        "source": stats.source,
        "kind": stats.kind,
        ("bins" if stats.kind == "histogram" else "ids"): int(stats.values.numel()),
        "vocab_size": vocab_size,
        "folded_ids": folded,
        "folded_note": (
            f"{folded} of {of} ids were >= the canary's vocab_size {vocab_size} and were folded into it "
            "(id % vocab_size)"
        )
        if folded
        else f"every id was below the canary's vocab_size {vocab_size}",
    }


def _wrapped(stream: torch.Tensor, min_len: int) -> torch.Tensor:
    """`stream` repeated end to end until it holds at least `min_len` ids (windows then wrap around)."""
    if len(stream) >= min_len:
        return stream
    return stream.repeat(-(-min_len // len(stream)))


def split_sample(ids: torch.Tensor, heldout_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample of ids in order -> (train, held-out): held-out is its last `heldout_fraction`, at least one id on
    each side (a one-id sample is both)."""
    if len(ids) < 2:
        return ids, ids
    cut = min(max(int(len(ids) * (1.0 - heldout_fraction)), 1), len(ids) - 1)
    return ids[:cut], ids[cut:]


def _from_sample(p: CanaryProfile, seed: int, stats: LoadedTokenStats) -> CanaryText:
    ids = stats.values
    folded = int((ids >= p.vocab_size).sum())
    ids = ids % p.vocab_size
    train, held = split_sample(ids, p.heldout_fraction)
    need = p.seq_len + 2  # one window of seq_len+1 ids, and more than one place to start it
    evidence = {
        **_user_evidence(stats, p.vocab_size, folded, len(ids)),
        "drawn": f"contiguous windows of {p.seq_len + 1} ids: training from the first "
        f"{1 - p.heldout_fraction:.0%} of the sample ({len(train)} ids), held-out from the last "
        f"{p.heldout_fraction:.0%} ({len(held)} ids)",
        "train_ids": len(train),
        "heldout_ids": len(held),
    }
    short = [name for name, part in (("training", train), ("held-out", held)) if len(part) < need]
    if short:
        evidence["wrapped"] = (
            f"the {' and '.join(short)} part(s) hold fewer than {need} ids and were repeated end to "
            "end, so windows wrap around; send a longer sample for independent windows"
        )
    return CanaryText(
        batches=draw_batches(_wrapped(train, need), p.steps, p.batch_size, p.seq_len, seed),
        heldout=heldout_set(_wrapped(held, need), p.heldout_sequences, p.seq_len),
        long_window=long_window(train, p, seed),
        evidence=evidence,
    )


def _from_histogram(p: CanaryProfile, seed: int, stats: LoadedTokenStats) -> CanaryText:
    probs = stats.values.to(torch.float64)
    probs = probs / probs.sum()
    width = p.seq_len + 1
    # the probes' own draw (worker.probes.token_stats): i.i.d. from the histogram, folded into [0, vocab_size)
    train, folded_train = stats.draw(p.steps * p.batch_size * width, p.vocab_size, torch.Generator().manual_seed(seed))
    held, folded_held = stats.draw(
        p.heldout_sequences * width, p.vocab_size, torch.Generator().manual_seed(HELDOUT_SEED)
    )
    evidence = {
        **_user_evidence(stats, p.vocab_size, folded_train + folded_held, train.numel() + held.numel()),
        "drawn": f"i.i.d. from the histogram: {train.numel()} training ids (audit seed), {held.numel()} "
        f"held-out ids (fixed seed {HELDOUT_SEED})",
        "folded_mass": float(probs[p.vocab_size :].sum()) if len(probs) > p.vocab_size else 0.0,
    }
    return CanaryText(
        batches=train.reshape(p.steps, p.batch_size, width).to(torch.int32),
        heldout=held.reshape(p.heldout_sequences, width),
        long_window=long_window(train, p, seed),  # the drawn training ids, end to end
        evidence=evidence,
    )
