"""A byte-level BPE trained on the corpus with HF `tokenizers`: deterministic, cached on disk."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from worker.text.corpus import corpus_text


def cache_dir() -> Path:
    root = Path(os.environ.get("KAUDIT_CACHE_DIR", Path.home() / ".cache" / "kernel-audit"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _train(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus_text()
    chunks = text.split("\n")
    tok.train_from_iterator(chunks, trainer=trainer, length=len(chunks))
    return tok


@lru_cache(maxsize=8)
def get_tokenizer(vocab_size: int) -> Tokenizer:
    """BPE with at most `vocab_size` ids (the corpus may support fewer); trained once, then read from cache."""
    key = hashlib.sha256(f"kjv-bpe-v1-{vocab_size}".encode()).hexdigest()[:16]
    path = cache_dir() / f"tokenizer-{vocab_size}-{key}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = _train(vocab_size)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tok.save(str(tmp))
    tmp.replace(path)
    return tok


@lru_cache(maxsize=8)
def _ids_array(vocab_size: int) -> np.ndarray:
    key = hashlib.sha256(f"kjv-ids-v1-{vocab_size}".encode()).hexdigest()[:16]
    path = cache_dir() / f"ids-{vocab_size}-{key}.npy"
    if path.exists():
        return np.load(path)
    tok = get_tokenizer(vocab_size)
    lines = corpus_text().split("\n")
    encs = tok.encode_batch([line + "\n" for line in lines])
    ids = np.fromiter((i for e in encs for i in e.ids), dtype=np.int64)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, ids)
    tmp.replace(path)
    return ids


# the vocabulary sizes a probe's real text is tokenised at: 2^k and 3 * 2^(k-1) from 256 (a byte-level BPE's alphabet)
VOCAB_LADDER: tuple[int, ...] = tuple(sorted({256 << k for k in range(12)} | {384 << k for k in range(11)}))


def ladder_vocab(vocab_size: int) -> int:
    """The largest ladder size not above `vocab_size` (itself below 256). A probe's vocabulary is drawn per audit
    (+-25%), and a BPE trained and applied at each drawn size cost 3.5 s on this 2-core machine per new size; at
    most 1.5x fewer ids than asked changes which rare tokens exist, not how often the frequent ones come."""
    fits = [v for v in VOCAB_LADDER if v <= vocab_size]
    return fits[-1] if fits else vocab_size


def text_vocab(high: int) -> int:
    """The vocabulary size `text_token_ids(high)` tokenises the corpus at: the ladder's below `high`, the byte-level
    alphabet's 256 for a smaller bound."""
    return ladder_vocab(high) if high >= VOCAB_LADDER[0] else VOCAB_LADDER[0]


def text_token_ids(high: int) -> torch.Tensor:
    """The corpus as a stream of token ids below `high`, for a probe's real text.

    From 256 ids up: tokenised at the ladder size. Below 256 (segment or class counts can be that small) a byte-level
    BPE cannot have so few ids: its alphabet alone is 256 bytes. There, the 256-id stream is relabelled by frequency
    rank and the ranks folded modulo `high`: the most frequent tokens keep ids of their own, and the rare ones add to
    them, so the distribution keeps its heavy head."""
    if high >= VOCAB_LADDER[0]:
        return corpus_token_ids(text_vocab(high))
    if high < 1:
        raise ValueError(f"no token ids below {high}")
    stream = corpus_token_ids(text_vocab(high))
    counts = torch.bincount(stream, minlength=VOCAB_LADDER[0])
    rank = torch.empty_like(counts)
    rank[torch.argsort(counts, descending=True, stable=True)] = torch.arange(counts.numel())
    return rank[stream] % high


def corpus_token_ids(vocab_size: int) -> torch.Tensor:
    """The whole corpus as one int64 token stream (about 1.1M tokens at 16k vocab)."""
    return torch.from_numpy(_ids_array(vocab_size).copy())
