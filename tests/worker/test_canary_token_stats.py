"""The canary's text from the user's token statistics: a sample gives contiguous windows of it (train from the
first 95%, held-out from the last 5%), a histogram i.i.d. draws; ids past the model's vocabulary are folded and
counted; the stage's evidence says which text it trained on."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from worker.canary.data import canary_text, draw_batches, heldout_set, split
from worker.canary.profiles import CPU
from worker.catalogue import load_catalogue
from worker.context import AuditContext
from worker.probes.token_stats import LoadedTokenStats
from worker.stages import canary as canary_stage
from worker.stages.result import StageStatus

P = CPU.model_copy(update={"steps": 20, "batch_size": 8, "seq_len": 16, "heldout_sequences": 10})


def _stats(array: np.ndarray, kind: str = "auto") -> LoadedTokenStats:
    buf = io.BytesIO()
    np.save(buf, array)
    return LoadedTokenStats.from_bytes(buf.getvalue(), "npy", kind, source="test stats")  # type: ignore[arg-type]


def test_without_statistics_the_builtin_text_is_unchanged() -> None:
    text = canary_text(P, 3, None)
    train, held = split(P.vocab_size, P.heldout_fraction)
    assert torch.equal(text.batches, draw_batches(train, P.steps, P.batch_size, P.seq_len, 3))
    assert torch.equal(text.heldout, heldout_set(held, P.heldout_sequences, P.seq_len))
    assert text.evidence["source"].startswith("built-in text") and text.evidence["user_statistics"] is False


def test_a_sample_gives_contiguous_windows_train_first_95_percent_heldout_last_5() -> None:
    n = 20_000
    p = P.model_copy(update={"vocab_size": n})  # every id in range: the window's start is its first id
    text = canary_text(p, 11, _stats(np.arange(n, dtype=np.int64)))
    cut = int(n * (1 - p.heldout_fraction))
    width = p.seq_len + 1
    rows = text.batches.reshape(-1, width).long()
    assert text.batches.shape == (p.steps, p.batch_size, width) and text.batches.dtype == torch.int32
    starts = rows[:, 0]
    assert torch.equal(rows, starts[:, None] + torch.arange(width))  # each row a contiguous window of the sample
    assert int(starts.max()) + width <= cut and len(set(starts.tolist())) > len(starts) // 2  # all in train; spread
    held = text.heldout.long()
    assert torch.equal(held, held[:, :1] + torch.arange(width))
    assert int(held[:, 0].min()) >= cut and int(held[:, -1].max()) < n  # all in the last 5%
    ev = text.evidence
    assert ev["user_statistics"] is True and ev["source"] == "test stats" and ev["kind"] == "sample"
    assert ev["train_ids"] == cut and ev["heldout_ids"] == n - cut and ev["folded_ids"] == 0
    # the same audit seed gives the same batches (every run of one audit trains on them); another seed others
    assert torch.equal(canary_text(p, 11, _stats(np.arange(n))).batches, text.batches)
    assert not torch.equal(canary_text(p, 12, _stats(np.arange(n))).batches, text.batches)


def test_ids_past_the_vocabulary_are_folded_and_counted() -> None:
    n, vocab = 10_000, P.vocab_size  # 2048
    text = canary_text(P, 5, _stats(np.arange(n, dtype=np.int32)))
    rows = text.batches.reshape(-1, P.seq_len + 1).long()
    assert int(rows.max()) < vocab and int(text.heldout.max()) < vocab
    assert torch.equal(rows, (rows[:, :1] + torch.arange(P.seq_len + 1)) % vocab)  # windows of (id % vocab)
    assert text.evidence["folded_ids"] == n - vocab and str(n - vocab) in text.evidence["folded_note"]

    hist = np.zeros(vocab + 10, dtype=np.float64)
    hist[[1, vocab + 3]] = [1.0, 1.0]  # half the mass on an id past the vocabulary: folded onto id 3
    htext = canary_text(P, 5, _stats(hist))
    assert set(htext.batches.unique().tolist()) == {1, 3}
    drawn = htext.batches.numel() + htext.heldout.numel()
    assert htext.evidence["folded_ids"] == int((htext.batches == 3).sum() + (htext.heldout == 3).sum())
    assert 0.4 * drawn < htext.evidence["folded_ids"] < 0.6 * drawn and htext.evidence["folded_mass"] == 0.5


def test_a_histogram_with_one_hot_id_gives_it_at_its_frequency_iid() -> None:
    vocab = P.vocab_size
    hist = np.ones(vocab, dtype=np.float32)
    hot, share = 42, 0.3
    hist[hot] = share / (1 - share) * (vocab - 1)  # id 42 carries 30% of the mass
    text = canary_text(P, 9, _stats(hist))
    ev = text.evidence
    assert ev["kind"] == "histogram" and ev["bins"] == vocab and ev["folded_ids"] == 0
    for drawn in (text.batches, text.heldout):
        n = drawn.numel()
        freq = float((drawn == hot).sum()) / n
        assert abs(freq - share) < 5 * math.sqrt(share * (1 - share) / n), (freq, n)
    # i.i.d.: neighbouring positions are independent (a window of text would repeat structure, not this)
    flat = text.batches.reshape(-1).long()
    both = float(((flat[1:] == hot) & (flat[:-1] == hot)).float().mean())
    assert abs(both - share * share) < 0.02
    # held-out draws are fixed, training draws follow the audit seed
    other = canary_text(P, 10, _stats(hist))
    assert torch.equal(other.heldout, text.heldout) and not torch.equal(other.batches, text.batches)


def test_a_short_sample_wraps_and_says_so() -> None:
    text = canary_text(P, 1, _stats(np.arange(200, dtype=np.int64)))  # held-out part: 10 ids < one window
    assert text.batches.shape == (P.steps, P.batch_size, P.seq_len + 1)
    assert text.heldout.shape == (P.heldout_sequences, P.seq_len + 1)
    assert set(text.heldout.unique().tolist()) <= set(range(190, 200))
    assert "held-out" in text.evidence["wrapped"] and "training" not in text.evidence["wrapped"]


@pytest.mark.slow
def test_the_stage_trains_on_the_users_ids_and_says_so() -> None:
    """Through the stage: the op's captured arguments come from the user's ids (50 distinct ids: every other row of
    the 2048-row gradient has no contribution), and the evidence names the statistics."""
    problem = load_catalogue().get("embedding_backward")
    rng = np.random.default_rng(0)
    stats = _stats(rng.integers(0, 50, size=5_000, dtype=np.int64))
    tiny = CPU.model_copy(
        update={
            "steps": 4,
            "checkpoints": (2, 4),
            "fidelity_steps": (0,),
            "fidelity_calls_per_step": 1,
            "heldout_sequences": 8,
        }
    )
    ctx = AuditContext(
        problem=problem.with_token_stats(stats), solution=problem.example_solution("pytorch_fp32"), device="cpu", seed=5
    )
    try:
        result = canary_stage.run(ctx, tiny)
    finally:
        ctx.close()
    assert result.status is StageStatus.passed, result.summary
    ev = result.evidence["text"]
    assert (
        ev["user_statistics"] is True and ev["source"] == "test stats" and ev["kind"] == "sample" and ev["ids"] == 5_000
    )
    empty = [f for f in result.evidence["fidelity_all"] if f["bucket"] == "0"]
    assert empty and empty[0]["rows"] >= tiny.vocab_size - 50
