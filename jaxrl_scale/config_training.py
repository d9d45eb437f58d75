"""Config sections of training: `rl` (the policy objective), `optim` (AdamW and the train
step's memory knobs), `sft` (the supervised warm start) and `pipeline` (how generation and
training overlap).

Part of `jaxrl_scale.config`, which assembles the sections into one `Config`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxrl_scale import config_io

_check = config_io.check


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """The policy objective: loss, aggregation, advantages, filters, curriculum."""

  loss: str = "cispo"  # registered name: cispo, grpo, dapo, gspo, reinforce
  aggregation: str = "prompt_avg"  # sample_avg, prompt_avg (ScaleRL), token_avg
  advantage_norm: str = "batch"  # registered name: batch (ScaleRL), prompt, none
  generations_per_prompt: int = 16  # G completions per prompt (paper: 16)
  prompts_per_step: int = 48  # prompts per optimizer step (paper: 48)
  eps_max: float = 5.0  # CISPO absolute cap on the importance ratio
  clip_low: float = 0.2  # GRPO / DAPO
  clip_high: float = 0.28  # DAPO (GRPO uses clip_low for both)
  gspo_clip_low: float = 3e-3  # GSPO: lower clip of the sequence-level ratio
  gspo_clip_high: float = 5e-3  # GSPO: upper clip of the sequence-level ratio
  zero_variance_filter: bool = True  # drop prompts whose G rewards are all equal from the loss
  length_penalty: bool = False  # DAPO overlong penalty instead of interruption
  length_penalty_max: int = 0  # L_max
  length_penalty_cache: int = 0  # L_cache
  # No-Positive-Resampling: a prompt whose pass rate so far reaches npr_threshold (after at
  # least npr_min_samples completions) leaves all later epochs.
  no_positive_resampling: bool = True
  npr_threshold: float = 0.9  # pass rate that retires a prompt (paper: 0.9)
  npr_min_samples: int = 16  # completions of a prompt seen before it can retire
  reward_correct: float = 1.0  # reward of a completion the verifier judges correct
  # Reward of one judged not correct (code_fraction maps its fraction of passed cases onto
  # [reward_incorrect, reward_correct]; verifier errors and timeouts get no reward at all).
  reward_incorrect: float = -1.0

  def __post_init__(self):
    _check(self.generations_per_prompt >= 2, "rl.generations_per_prompt",
           "must be >= 2 (advantages are group-centred)")
    _check(self.prompts_per_step >= 1, "rl.prompts_per_step", "must be >= 1")
    _check(self.eps_max > 0, "rl.eps_max", "must be > 0")
    _check(0 < self.npr_threshold <= 1, "rl.npr_threshold", "must be in (0, 1]")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with linear warmup then a constant rate (paper: lr 5e-7, eps 1e-15, wd 0.01),
  or, with schedule "cosine", a cosine decay to lr * min_lr_ratio over decay_steps."""

  lr: float = 5e-7  # peak learning rate (paper: 5e-7)
  warmup_steps: int = 100  # updates of linear warmup up to lr (paper: 100)
  # "constant" after warmup (the paper's); "cosine" decays over `decay_steps` updates after
  # the warmup to lr * min_lr_ratio and stays there.
  schedule: Literal["constant", "cosine"] = "constant"
  decay_steps: int = 0  # cosine: updates from peak to the floor (> 0 with cosine)
  min_lr_ratio: float = 0.0  # cosine: the floor, as a fraction of lr
  b1: float = 0.9  # AdamW first-moment decay
  b2: float = 0.999  # AdamW second-moment decay
  eps: float = 1e-15  # paper: avoids epsilon underflow acting as implicit gradient clipping
  weight_decay: float = 0.01  # AdamW decoupled weight decay (paper: 0.01)
  max_grad_norm: float | None = None  # global-norm clipping; None = off
  # Prompts per micro-batch (gradient accumulation); 0 = the whole batch in one. Raised to
  # the fewest whose G rows split over the trainer's data-parallel chips where these do
  # not (train and plan say so in one line): otherwise every chip computes all the rows.
  micro_batch_prompts: int = 0
  max_nonfinite_steps: int = 5  # abort after this many NaN/inf updates in a row
  # MoE policies: weight of the router's load-balancing loss added to the policy loss in
  # every train step (RL and SFT). null = the model's own (router_aux_loss_coef of its HF
  # config or preset: 0.001 for Qwen3-MoE); 0 = off. Dense models ignore it.
  router_aux_loss_coef: float | None = None
  # Train-step LM head over this many positions at a time (rematerialised), so the fp32
  # [rows, seq, vocab] logits never exist at once (at 16k x 152k they are 9.3 GiB per row);
  # 0 = all positions together.
  logits_chunk: int = 512
  # Rematerialisation of the decoder layers in the backward pass: "full" stores only each
  # layer's input (fits a 16k sequence), "dots" also keeps matmul outputs (faster, more
  # memory), "attention" keeps the attention block's outputs and recomputes the MLP (between
  # the two), "context" keeps only the attention kernel's output (reruns the projections,
  # not the kernel; a little more memory than "full"), "matmuls" keeps what "dots" does plus
  # the attention kernel's output (recomputes only elementwise work), "none" keeps every
  # activation (small models only).
  remat: Literal["none", "full", "dots", "attention", "context", "matmuls"] = "full"
  # Megatron-style sequence parallelism in the train step: the residual stream between
  # decoder layers (the layer scan's carry, what remat keeps per layer) is split along the
  # sequence over the trainer's 'tp' axis instead of repeated on every tp chip; attention,
  # MLP and MoE run as without it. Needs the sequence length (data.max_prompt_tokens +
  # sampler.max_new_tokens) divisible by mesh.trainer_tp; a no-op at trainer_tp 1.
  sequence_parallel: bool = False

  def __post_init__(self):
    _check(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
    _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
    _check(self.schedule in ("constant", "cosine"), "optim.schedule",
           f"must be constant or cosine, got {self.schedule!r}")
    _check(self.schedule != "cosine" or self.decay_steps > 0, "optim.decay_steps",
           f"must be > 0 with schedule cosine, got {self.decay_steps}")
    _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio",
           f"must be in [0, 1], got {self.min_lr_ratio}")
    _check(self.eps >= 0, "optim.eps", "must be >= 0")
    _check(self.micro_batch_prompts >= 0, "optim.micro_batch_prompts", "must be >= 0")
    _check(self.router_aux_loss_coef is None or self.router_aux_loss_coef >= 0,
           "optim.router_aux_loss_coef", f"must be >= 0 or null, got {self.router_aux_loss_coef}")
    _check(self.max_grad_norm is None or self.max_grad_norm > 0, "optim.max_grad_norm",
           f"must be > 0 or null, got {self.max_grad_norm}")
    _check(self.logits_chunk >= 0, "optim.logits_chunk", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Supervised warm start on (prompt, solution) pairs before RL."""

  steps: int = 0  # 0 = no warm start
  lr: float = 1e-3  # AdamW learning rate of the warm start
  batch_size: int = 32  # (prompt, solution) examples per SFT step
  warmup_steps: int = 10  # updates of linear warmup up to sft.lr
  weight_decay: float = 0.0  # AdamW decoupled weight decay of the warm start
  max_grad_norm: float | None = 1.0  # global-norm clipping; None = off
  micro_batch_size: int = 0  # examples per micro-batch; 0 = whole batch at once

  def __post_init__(self):
    _check(self.steps >= 0, "sft.steps", "must be >= 0")
    _check(self.lr > 0, "sft.lr", f"must be > 0, got {self.lr}")
    _check(self.batch_size >= 1, "sft.batch_size", f"must be >= 1, got {self.batch_size}")
    _check(self.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0")
    _check(self.max_grad_norm is None or self.max_grad_norm > 0, "sft.max_grad_norm",
           f"must be > 0 or null, got {self.max_grad_norm}")
    _check(self.micro_batch_size >= 0, "sft.micro_batch_size", "must be >= 0")
    _check(self.micro_batch_size == 0 or self.batch_size % self.micro_batch_size == 0,
           "sft.micro_batch_size",
           f"must divide sft.batch_size={self.batch_size}, got {self.micro_batch_size}")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """How generation and training overlap (paper sec. 3.1)."""

  # pipeline: PipelineRL-k (streaming, in-flight weight updates); ppo_offpolicy: k batches
  # with one policy, then k updates; sync: generate, then train; colocated: sync on one
  # device set shared by both roles.
  mode: Literal["pipeline", "ppo_offpolicy", "sync", "colocated"] = "pipeline"
  max_staleness: int = 8  # PipelineRL-k / PPO-off-policy-k
  queue_size: int = 4  # rollout batches buffered on the host
  reward_workers: int = 4  # host threads running the verifiers
  reward_timeout_s: float = 5.0  # per-response verifier deadline

  def __post_init__(self):
    _check(self.max_staleness >= 0, "pipeline.max_staleness", "must be >= 0")
    _check(self.queue_size >= 1, "pipeline.queue_size", "must be >= 1")
    _check(self.reward_workers >= 1, "pipeline.reward_workers", "must be >= 1")
    _check(self.reward_timeout_s > 0, "pipeline.reward_timeout_s", "must be > 0")
    _check(self.mode != "pipeline" or self.max_staleness >= 1, "pipeline.max_staleness",
           "must be >= 1 in pipeline mode (k = 0 is mode 'sync')")
