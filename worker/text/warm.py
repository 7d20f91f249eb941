"""Build, ahead of any audit, the tokenised texts that this machine's audits can ask for.

A probe's real-text ids come from the corpus tokenised at a ladder size (worker.text.tokenizer.ladder_vocab), and
a probe's vocabulary axis is drawn per audit within +-25% (worker.generic.shapes), so one probe can need any of two
or three sizes. The first audit that meets a size trains a byte-level BPE and tokenises the corpus: 1.4-1.7 s per
size on a 2-core machine, 0.8-1.0 s on the H200's 16-core host (benchmarks/results/h200-2026-12-03/session10,
`text_cache_s` in its time-to-verdict files). Done here, before the
service takes audits (the image build, an operator's `kaudit warm-cache`), no audit pays it. What is built is
trusted text only, keyed by size on disk (KAUDIT_CACHE_DIR); a size missed here is built on first use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from worker.canary.profiles import profile_for
from worker.catalogue import Catalogue, Profile
from worker.generic.shapes import jitter_bounds
from worker.text.tokenizer import VOCAB_LADDER, corpus_token_ids, text_vocab

REAL_TEXT = "real_text_ids"


def _ladder_sizes(lo: int, hi: int) -> set[int]:
    """Every size text_token_ids tokenises at for an id bound in [lo, hi] (text_vocab steps up at ladder sizes)."""
    return {text_vocab(lo)} | {v for v in VOCAB_LADDER if lo < v <= hi}


def vocab_sizes(catalogue: Catalogue, profile: Profile) -> list[int]:
    """The canary's vocabulary and every ladder size a curated probe's real-text input can be drawn at."""
    sizes = {profile_for(profile).vocab_size}
    for problem in catalogue:
        spec = problem.spec
        for probe in spec.probes:
            axes = probe.axes_for(profile)
            for gen in probe.inputs.values():
                params = gen.params
                if gen.kind != REAL_TEXT and params.get("base") != REAL_TEXT:
                    continue
                high = axes.get(str(params.get("high_axis", "")))
                if high is None:
                    continue
                lo, hi = jitter_bounds(high) if spec.jitter_axes else (high, high)
                sizes |= _ladder_sizes(lo, hi)
    return sorted(sizes)


def warm_text_cache(sizes: Iterable[int], on_size: Callable[[int, float], None] | None = None) -> dict[int, float]:
    """Tokenise the corpus at each size (read back from disk where already built); seconds per size."""
    took: dict[int, float] = {}
    for size in sizes:
        t = time.perf_counter()
        corpus_token_ids(size)
        took[size] = round(time.perf_counter() - t, 2)
        if on_size is not None:
            on_size(size, took[size])
    return took
