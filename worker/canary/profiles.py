"""Canary sizes: a CPU profile for a 2-core machine, and a GPU profile."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.canary.checkpoint_wire import PIECE_ELEMENTS

Optimizer = Literal["sgd", "adamw"]


class CanaryProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    # model
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = Field(
        None, description="key/value heads where fewer than n_heads (grouped-query attention)"
    )
    n_experts: int = Field(8, description="experts of the MoE feed-forward (the moe_routing site's model only)")
    top_k: int = Field(2, description="experts each token is routed to (the moe_routing site's model only)")
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_max_position: int = Field(65536, description="the RoPE site's sequences start at offsets spread up to here")
    max_params: int = Field(
        4_000_000,
        description="the largest model a definition's constant axes may ask for: "
        "a canary past it is skipped, with the reason",
    )
    # data
    seq_len: int
    batch_size: int
    steps: int
    heldout_fraction: float = 0.05
    heldout_sequences: int = Field(description="held-out sequences every checkpoint is evaluated on")
    # optimisers
    sgd_lr: float = 0.3
    sgd_momentum: float = 0.9
    adamw_lr: float = 3e-3
    adamw_weight_decay: float = 0.01
    grad_clip: float = 1.0
    optimizers: tuple[Optimizer, ...] = ("sgd", "adamw")
    # evidence
    checkpoints: tuple[int, ...] = Field(
        description="steps after which weights are kept and evaluated on held-out text"
    )
    fidelity_steps: tuple[int, ...] = Field(
        description="steps of the reference SGD run where the op's gradient is checked vs fp64"
    )
    fidelity_calls_per_step: int = 2
    fidelity_context: int = Field(
        0,
        description="tokens of one longer real-text window on which the op is checked once more, at the last fidelity "
        "step, where its reduction spans the sequence (attention); 0: no such check",
    )
    # noise floor
    perturbed_runs: int = Field(
        description="reference runs with the op output moved by 1 ulp on a random half of elements, per optimiser"
    )
    repeat_runs: int = Field(
        description="plain reruns of the reference, per optimiser (GPU atomics are not deterministic)"
    )
    confirm_nulls: int = Field(
        0,
        description="more 1-ulp nulls per optimiser, trained only when a gap still exceeds its threshold after the "
        "first ones: one null's band can under-state how far a chaotic seed spreads rounding-level differences",
    )
    # rule
    band_factor: float = Field(3.0, description="a loss gap fails above band_factor x the largest null gap ...")
    loss_floor: float = Field(description="... and above this many nats, whichever is larger")
    autocast_bf16: bool = False
    threads: int | None = Field(
        None,
        description="torch intra-op threads for every run (None: leave as is); 1 avoids spin-wait contention on shared CPUs",
    )
    child_timeout_s: float = 300.0
    lazy_nulls: bool = Field(
        False,
        description="train the null runs only when the rule needs them: a mean held-out gap "
        "at or below loss_floor passes whatever the nulls say (the threshold is never below the floor), "
        "so the nulls are trained after the submission's runs, and only where a gap exceeds the floor in size "
        "(worker.stages.canary.losses)",
    )
    seed_pool: int | None = Field(
        None,
        description="canary seeds drawn from this many fixed ones, so that the parent's "
        "runs repeat and are read from disk (worker.canary.parent_cache); None: a fresh seed "
        "per audit, nothing cached",
    )
    wire_piece_elements: int = Field(
        PIECE_ELEMENTS,
        ge=1,
        description="the most elements of one tensor the submission's checkpoint weights cross in "
        "(worker.canary.checkpoint_wire)",
    )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_expert(self) -> int:
        """An MoE expert's hidden size: the MLP's d_ff split among the experts, so that the MoE model's expert weights
        (and its dense compute of every expert) are the plain MLP's."""
        return max(self.d_ff // self.n_experts, 1)


CPU = CanaryProfile(
    name="cpu",
    vocab_size=2048,
    d_model=64,
    n_layers=2,
    n_heads=4,
    d_ff=256,
    seq_len=64,
    batch_size=32,
    steps=80,
    heldout_sequences=64,
    checkpoints=(10, 20, 40, 60, 80),
    fidelity_steps=(0, 40, 80),
    # a bf16 attention accumulator's error grows with the keys it sums, slowly: on Gaussian inputs 1.4x the ideal error
    # at 64 tokens, 2.2-2.6x at 2,048, 3.3-5.1x at 8,192 (benchmarks/results/attention_accumulator_growth_cpu.txt);
    # on this model's trained arguments 6.4x at 8,192 (tests/worker/test_canary_sites_stage.py), caught
    fidelity_context=8192,
    threads=1,
    sgd_lr=0.1,
    # one 1-ulp null per optimiser: on the CPU its held-out gap is ~5e-5 nats (benchmarks/results/canary_cost_cpu.txt),
    # so the threshold max(3 x band, 0.01) is the floor; a second null changed it only above 0.0033 nats
    perturbed_runs=1,
    repeat_runs=0,  # the CPU is deterministic: a rerun of the reference gives a gap of exactly 0
    loss_floor=0.01,
    child_timeout_s=180.0,
    # the parent's four runs are most of a CPU canary (34-41 s of 36-44 s for cross-entropy, 2026-12-02): four fixed
    # seeds let a worker read them back after the first audit of a problem at each
    seed_pool=4,
    # the parent trained four runs to the submission's two; without the nulls the two processes train two each, side
    # by side on the two cores. A correct kernel's gap is ~0, so the nulls are trained only for a gap over the floor
    lazy_nulls=True,
    # a definition's constant axes may widen the model (worker.canary.sizing): the default model has 0.36M parameters;
    # past 1.5M a CPU canary's runs no longer fit its training limit
    max_params=1_500_000,
)

GPU = CanaryProfile(
    name="gpu",
    vocab_size=16384,
    d_model=256,
    n_layers=4,
    n_heads=4,
    d_ff=1024,
    seq_len=256,
    batch_size=32,
    # 100 steps and one null per optimiser: at 200 steps with two nulls the loss gap never separated a bad kernel
    # (every GPU canary failure came from the gradient-fidelity check) and the stage cost 17-33 s of an audit;
    # the fidelity check runs on real batches at steps 0, 50 and 100 instead of 0, 100 and 200
    steps=100,
    sgd_lr=0.1,  # at 0.3 the embedding-site model is chaotic on the GPU (null gaps up to 0.13 nats)
    heldout_sequences=128,
    checkpoints=(25, 50, 75, 100),
    fidelity_steps=(0, 50, 100),
    fidelity_context=8192,  # as on the CPU: the context a long-context model trains at, not the canary's 256
    perturbed_runs=1,
    repeat_runs=0,
    loss_floor=0.1,
    # on the H200 (2026-12-06, benchmarks/results/h200-2026-12-06/) 2 of 55 canaries of correct fp32 kernels at five
    # sites failed on the loss gap alone (0.1425 and 0.1430 nats against one null's limit of 0.1 and 0.141), their
    # op at the ideal error; a gap past one null's limit is judged against three more before it fails a kernel
    confirm_nulls=3,
    autocast_bf16=True,
    child_timeout_s=300.0,
    # as on the CPU: the parent's runs are read back after the first audit of a problem at each of four seeds (an
    # entry holds SGD's weights at two fidelity steps, about 92 MB), and the nulls train only for a gap over the floor
    seed_pool=4,
    lazy_nulls=True,
    max_params=600_000_000,
)

PROFILES: dict[str, CanaryProfile] = {"cpu": CPU, "gpu": GPU}


def profile_for(name: str, **overrides: object) -> CanaryProfile:
    base = PROFILES[name]
    return base.model_copy(update=overrides) if overrides else base
