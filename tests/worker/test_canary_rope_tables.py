"""The rope site given cos/sin tables instead of positions (FLUX.1's rope, HF's apply_rotary_pos_emb): q and k (or one
tensor) as [tokens, heads, head_dim] or [batch, seq, heads, head_dim], the tables one row per token or per sequence
position, matched from the signature with the layout (NeoX halves or GPT-J pairs) and the tables' width read from the
reference; in training the trusted side builds the tables at the model's long positions, and a [batch, seq, ...]
kernel is called once per sequence, the longest positions first (worker.canary.families.rope)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.canary_support import train_with_ops
from worker.canary.binding import Kernel, OpBinding
from worker.canary.families.rope import tables
from worker.canary.forward import rope_positions
from worker.canary.matching import SiteMatch, site_for
from worker.canary.model import build, init_state
from worker.canary.ops import Ops
from worker.canary.profiles import CanaryProfile, profile_for
from worker.canary.sites import KernelOps
from worker.canary.train import perturbed_kernel, reference_kernel
from worker.catalogue import load_catalogue
from worker.formats import Definition
from worker.reference import Reference

FLUX = Path(__file__).resolve().parents[2] / "benchmarks" / "official_samples" / "flux_rope" / "definition.json"
CPU = profile_for("cpu")

# HF's apply_rotary_pos_emb on [batch, seq, heads, head_dim]: NeoX halves, each table cat(freqs, freqs)
NEOX_REFERENCE = """import torch

def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

def run(q, k, cos, sin):
    c, s = cos[None, :, None, :].float(), sin[None, :, None, :].float()
    qf, kf = q.float(), k.float()
    return (qf * c + _rotate_half(qf) * s).to(q.dtype), (kf * c + _rotate_half(kf) * s).to(k.dtype)
"""

# GPT-J pairs with one table column per pair ([tokens, head_dim/2]); SIGN = -1 turns the rotation backwards
HALF_REFERENCE = """import torch

SIGN = {sign}

def run(x, cos, sin):
    xf = x.float()
    c, s = cos.float()[:, None, :], SIGN * sin.float()[:, None, :]
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)
"""


def _flux(free_width: bool) -> Definition:
    """FLUX.1's rope stand-in; free_width: its heads and head dim left free so that the CPU's model can train it, and
    in fp32 (the kernel is called at the definition's dtypes: in bf16 an exact kernel and a bf16 rotation agree)."""
    raw = json.loads(FLUX.read_text())
    if free_width:
        raw["axes"]["num_heads"] = {"type": "var"}
        raw["axes"]["head_dim"] = {"type": "var"}
        for spec in (*raw["inputs"].values(), *raw["outputs"].values()):
            spec["dtype"] = "float32"
    return Definition.model_validate(raw)


def _neox() -> Definition:
    four = {"shape": ["batch", "seq_len", "num_heads", "head_dim"], "dtype": "float32"}
    table = {"shape": ["seq_len", "head_dim"], "dtype": "float32"}
    return Definition.model_validate(
        {
            "name": "hf_apply_rotary_pos_emb_bshd",
            "op_type": "rope",
            "axes": {a: {"type": "var"} for a in ("batch", "seq_len", "num_heads", "head_dim")},
            "inputs": {"q": four, "k": four, "cos": table, "sin": table},
            "outputs": {"q_embed": four, "k_embed": four},
            "reference": NEOX_REFERENCE,
        }
    )


def _half(sign: int) -> Definition:
    three = {"shape": ["num_tokens", "num_heads", "head_dim"], "dtype": "float32"}
    table = {"shape": ["num_tokens", "half_dim"], "dtype": "float32"}
    return Definition.model_validate(
        {
            "name": f"rope_gptj_half_tables_{'fwd' if sign > 0 else 'backwards'}",
            "axes": {a: {"type": "var"} for a in ("num_tokens", "num_heads", "head_dim", "half_dim")},
            "inputs": {"x": three, "cos_cache": table, "sin_cache": table},
            "outputs": {"out": three},
            "reference": HALF_REFERENCE.format(sign=sign),
        }
    )


def _match(d: Definition, p: CanaryProfile = CPU) -> SiteMatch:
    return site_for(d, None, Reference.of(d).run_fn, p)


def _roles(found: SiteMatch) -> dict[str, str]:
    assert found.binding is not None, found.how
    return {s.name: s.role for s in (*found.binding.inputs, *found.binding.outputs)}


# --- matching ----------------------------------------------------------------------------------------------------


def test_the_flux_stand_in_matches_rope_as_gptj_pairs_with_its_tables() -> None:
    found = _match(_flux(free_width=False), profile_for("gpu"))
    assert _roles(found) == {"query_or_key": "x", "freqs_cos": "cos", "freqs_sin": "sin", "output": "x_out"}
    b = found.binding
    assert b is not None and b.site == "rope" and "matched site 'rope' from the signature" in found.how
    assert b.options.rope_layout == "interleaved" and not b.options.rope_half_table and b.options.rope_theta is None
    assert (found.profile.n_heads, found.profile.d_model) == (24, 24 * 128)  # FLUX.1's heads and head dim
    # at the CPU profile FLUX.1's width is past max_params: the rope site is the one that says so
    cpu = _match(_flux(free_width=False))
    assert cpu.binding is None and "rope: at the definition's constant sizes" in cpu.how
    free = _match(_flux(free_width=True))
    assert free.binding is not None and free.binding.options.rope_layout == "interleaved", free.how
    assert free.profile == CPU


def test_an_hf_style_neox_rope_with_full_width_tables_matches_neox() -> None:
    found = _match(_neox())
    assert _roles(found) == {"q": "q", "k": "k", "cos": "cos", "sin": "sin", "q_embed": "q_out", "k_embed": "k_out"}
    assert found.binding is not None
    assert found.binding.options.rope_layout == "neox" and not found.binding.options.rope_half_table


def test_half_width_tables_are_read_from_the_reference_and_a_backwards_rotation_fits_no_site() -> None:
    found = _match(_half(+1))
    assert _roles(found) == {"x": "x", "cos_cache": "cos", "sin_cache": "sin", "out": "x_out"}
    assert found.binding is not None
    assert found.binding.options.rope_layout == "interleaved" and found.binding.options.rope_half_table
    backwards = _match(_half(-1))
    assert backwards.binding is None
    assert "rope: the reference does not compute the site's op" in backwards.how


def test_the_catalogue_rope_still_matches_from_positions_as_before() -> None:
    d = load_catalogue().get("rope").definition
    found = _match(d)
    assert _roles(found) == {
        "query": "q",
        "key": "k",
        "positions": "positions",
        "rope_theta": "theta",
        "query_out": "q_out",
        "key_out": "k_out",
    }
    assert found.binding is not None
    assert found.binding.options.rope_layout == "neox" and found.binding.options.rope_theta is None
    assert not found.binding.options.rope_half_table
    # the agreement the coverage record gives this definition (benchmarks/results/canary_coverage_cpu.md)
    assert found.how.endswith("the reference agrees with the site's op on an example (0.42 ulp)")
    assert found.profile == CPU.model_copy(update={"n_kv_heads": 2})


# --- training ----------------------------------------------------------------------------------------------------

BATCH, STEPS = 4, 4


def _batches(p: CanaryProfile) -> torch.Tensor:
    return torch.randint(0, p.vocab_size, (STEPS, BATCH, p.seq_len + 1), generator=torch.Generator().manual_seed(0))


def _train(found: SiteMatch, ops: Ops) -> tuple[list[float], dict[str, torch.Tensor]]:
    """SGD steps as worker.canary.train runs them, with any ops: the losses and the final weights."""
    return train_with_ops(found, ops, _batches(found.profile), "sgd")


def _bf16_tables(inner: Kernel, b: OpBinding) -> Kernel:
    """The rotation by the tables rounded to bf16 first, while the definition's tables are fp32."""
    at = {i for i, s in enumerate(b.inputs) if s.role in ("cos", "sin")}

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        return inner([a.bfloat16().float() if i in at else a for i, a in enumerate(args)], specs)

    return k


def _tables_cached_by_shape(inner: Kernel, b: OpBinding) -> Kernel:
    """The tables of the first call of each shape, kept for every later call (as rotary caches keyed on the sequence
    length keep them): right wherever every sequence starts at the same position, wrong at the canary's offsets."""
    at = [i for i, s in enumerate(b.inputs) if s.role in ("cos", "sin")]
    cache: dict[tuple[int, ...], list[Any]] = {}

    def k(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        kept = cache.setdefault(tuple(args[at[0]].shape), [args[i] for i in at])
        return inner([kept[at.index(i)] if i in at else a for i, a in enumerate(args)], specs)

    return k


def _divergence(weights: dict[str, torch.Tensor], trusted: dict[str, torch.Tensor]) -> float:
    """The largest relative distance of a parameter from the trusted run's."""
    return max(float((weights[n] - w).norm() / w.norm()) for n, w in trusted.items())


@pytest.mark.parametrize("definition", [_flux(free_width=True), _neox(), _half(+1)], ids=lambda d: d.name)
def test_an_exact_kernel_trains_bit_for_bit_as_the_trusted_op_and_bf16_tables_do_not(definition: Definition) -> None:
    found = _match(definition)
    assert found.binding is not None, found.how
    exact = reference_kernel(Reference.of(definition).run_fn)  # each reference here rotates in fp32
    losses_t, weights_t = _train(found, Ops())
    losses_k, weights_k = _train(found, KernelOps(found.binding, exact))
    assert all(a == b for a, b in zip(losses_k, losses_t, strict=True)), (losses_k, losses_t)
    assert all(torch.equal(weights_k[n], w) for n, w in weights_t.items())
    # rounding noise: the exact kernel's outputs moved by 1 ulp on half their elements (the canary's null)
    _, weights_null = _train(found, KernelOps(found.binding, perturbed_kernel(exact, 1, "cpu")))
    null = _divergence(weights_null, weights_t)
    losses_bad, weights_bad = _train(found, KernelOps(found.binding, _bf16_tables(exact, found.binding)))
    assert any(a != b for a, b in zip(losses_bad, losses_t, strict=True))
    assert _divergence(weights_bad, weights_t) > 10 * null > 0  # ~65x on the CPU, at these 4 steps


@pytest.mark.parametrize("definition", [_flux(free_width=True), _neox()], ids=lambda d: d.name)
def test_tables_kept_from_another_sequence_train_differently(definition: Definition) -> None:
    """Why a [batch, seq, ...] kernel is called per sequence: were every sequence at one offset, a kernel that keeps
    the first table it is given would be exact; at the canary's offsets its forward rotates by other angles than the
    trusted backward rotates back, and training moves far past rounding noise."""
    found = _match(definition)
    assert found.binding is not None, found.how
    exact = reference_kernel(Reference.of(definition).run_fn)
    _, weights_t = _train(found, Ops())
    _, weights_null = _train(found, KernelOps(found.binding, perturbed_kernel(exact, 1, "cpu")))
    _, weights_bad = _train(found, KernelOps(found.binding, _tables_cached_by_shape(exact, found.binding)))
    assert _divergence(weights_bad, weights_t) > 1000 * _divergence(weights_null, weights_t)  # ~13,000x


def test_a_batch_seq_kernel_is_called_per_sequence_with_its_positions_longest_first() -> None:
    found = _match(_flux(free_width=True))
    p, b = found.profile, found.binding
    assert b is not None
    calls: list[list[Any]] = []
    exact = reference_kernel(Reference.of(_flux(free_width=True)).run_fn)

    def recording(args: list[Any], specs: list[dict[str, Any]]) -> list[torch.Tensor]:
        calls.append(args)
        return exact(args, specs)

    model = build(p, b, init_state(p, b, 0), "cpu")
    model.loss(_batches(p)[0], KernelOps(b, recording))
    # per layer: q then k of each sequence, the last sequence (the longest positions) first
    assert len(calls) == p.n_layers * BATCH * 2
    dh = p.d_model // p.n_heads
    positions = rope_positions(BATCH, p.seq_len, p, torch.device("cpu"))
    want = [tables(positions[i], dh, p.rope_theta, b.options) for i in range(BATCH)]
    for n, (x, cos, sin) in enumerate(calls[: BATCH * 2]):
        seq = BATCH - 1 - n // 2
        assert x.shape == (1, p.seq_len, p.n_heads if n % 2 == 0 else p.kv_heads, dh)
        assert torch.equal(cos, want[seq][0]) and torch.equal(sin, want[seq][1])
    assert int(positions[BATCH - 1, -1]) > p.rope_max_position // 2  # the first calls rotate far from position 0
