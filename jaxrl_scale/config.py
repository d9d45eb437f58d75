"""Typed run configuration: nested frozen dataclasses, YAML overrides, dotted CLI overrides.

One source of truth: the dataclasses below hold every default. A YAML file only overrides
them, and `key.sub=value` arguments override the file. Every section validates itself in
`__post_init__`; an unknown key, a wrong type or an invalid value becomes a one-line
`UserError` naming the dotted key (with the nearest valid name for typos); the loading
itself is `config_io`'s.

    cfg = config.load("configs/cpu_tiny.yaml", ["rl.loss=grpo", "optim.lr=1e-6"])
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from typing import Literal

from jaxrl_scale import config_io
from jaxrl_scale.errors import UserError

def _check(cond: bool, key: str, message: str) -> None:
  if not cond:
    raise UserError(f"config key '{key}': {message}")


# ----------------------------------------------------------------------------------------
# Sections.


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Where a run writes and how long it runs."""

  name: str = "run"  # the run's label, kept in its resolved config.yaml
  output_dir: str = "runs/run"  # run directory (train's --output-dir overrides it)
  seed: int = 0  # model init, sampling and rollout seeds
  steps: int = 100  # RL optimizer steps
  log_every: int = 1  # steps between progress lines (eval steps always print)
  tensorboard: bool = True  # TensorBoard event files beside metrics.jsonl
  progress: bool = True  # print progress lines to stdout
  # End the SFT warm start (sft.steps at most) once the policy's sampled pass rate on
  # `sft_dev_prompts` training prompts held out of SFT reaches this, checked every
  # `sft_check_every` steps (every step once half the target is reached): RL then starts
  # from a known level of skill rather than wherever a fixed step count lands (small models
  # learn in sudden jumps). None = all sft.steps.
  sft_stop_pass_rate: float | None = None
  sft_dev_prompts: int = 64  # training prompts held out of SFT to measure that pass rate
  sft_check_every: int = 5  # SFT steps between those measurements

  def __post_init__(self):
    _check(self.steps >= 0, "run.steps", f"must be >= 0, got {self.steps}")
    _check(self.log_every >= 1, "run.log_every", f"must be >= 1, got {self.log_every}")
    _check(self.sft_stop_pass_rate is None or 0 < self.sft_stop_pass_rate <= 1,
           "run.sft_stop_pass_rate", f"must be in (0, 1] or null, got {self.sft_stop_pass_rate}")
    _check(self.sft_dev_prompts >= 1, "run.sft_dev_prompts", "must be >= 1")
    _check(self.sft_check_every >= 1, "run.sft_check_every", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Which policy to train: a named preset (random init) or a Hugging Face directory."""

  preset: str = "tiny_llama"  # models/config.py preset, e.g. tiny_llama, qwen3_0p6b, llama3p1_8b
  path: str | None = None  # Hugging Face directory; overrides preset when set
  tokenizer: str = "byte"  # "byte" (built-in) or a directory holding tokenizer.json
  dtype: Literal["float32", "bfloat16"] = "float32"  # activations (the forward's compute)
  # Weights as loaded and as the generator holds them. The trainer always keeps float32
  # master weights and AdamW moments (a bf16 weight does not move at lr 5e-7) and sends the
  # generator a copy cast to this dtype; checkpoints hold the float32 masters.
  param_dtype: Literal["float32", "bfloat16"] = "float32"
  # ScaleRL "FP32 logits": LM head matmul and log-softmax in float32 in BOTH sampler and
  # trainer, whatever the activation dtype (paper sec. 3.2: A 0.52 -> 0.61).
  lm_head_fp32: bool = True
  # Full-sequence attention (train step, prefill): "auto" = the Pallas splash kernel on TPU,
  # cuDNN's fused flash attention on NVIDIA GPUs (bfloat16/float16 activations), the einsum
  # elsewhere; "einsum" forces the XLA reference everywhere (e.g. if cuDNN fails on a GPU).
  attention_impl: Literal["auto", "einsum", "cudnn", "splash"] = "auto"
  # Shape overrides of a preset (random init only), e.g. to size the CPU demo's model.
  hidden_size: int | None = None
  num_layers: int | None = None  # decoder layers of the preset; null = the preset's
  intermediate_size: int | None = None  # MLP width of the preset; null = the preset's
  init_std: float = 0.02  # std of the random init of matrices (presets without a path)
  # MoE policies: "own" = the trainer routes every token itself; "record" = the sampler
  # also records its expert choices (layers x top-k per position) and the trainer logs
  # train/routing_mismatch against them; "replay" = the trainer's forward uses the recorded
  # choices (gates still from its own router) and logs how often its own would differ.
  # No effect, and no cost, on a dense model.
  routing: Literal["own", "record", "replay"] = "own"

  def __post_init__(self):
    for key in ("hidden_size", "num_layers", "intermediate_size"):
      v = getattr(self, key)
      _check(v is None or v >= 1, f"model.{key}", f"must be >= 1 or null, got {v}")
    _check(self.init_std > 0, "model.init_std", f"must be > 0, got {self.init_std}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """How the device set splits into a trainer slice and a generator slice.

  `trainer_devices` / `generator_devices` are counts (int >= 1) or fractions of all devices
  (0 < x < 1). With `colocated` both roles share all devices and alternate.
  """

  colocated: bool = False  # both roles on all devices, taking turns
  trainer_devices: float = 0.5  # devices of the trainer slice: a count or a fraction
  generator_devices: float = 0.5  # devices of the generator slice: a count or a fraction
  trainer_tp: int = 1  # trainer mesh is ('fsdp', 'tp'); fsdp takes the remaining devices
  generator_tp: int = 1  # generator mesh is ('data', 'tp'); data takes the remaining devices
  # Expert parallelism: >1 adds an 'expert' axis to the trainer mesh, ('fsdp', 'expert',
  # 'tp'), taken out of fsdp; each device holds E / trainer_ep of an MoE layer's experts and
  # the tokens go to them. Outside the MoE layers it splits the batch like fsdp.
  trainer_ep: int = 1
  # As trainer_ep, for each generator group: ('data', 'expert', 'tp'), taken out of data.
  generator_ep: int = 1
  simulated_cpu_devices: int = 8  # CPU only: devices to simulate when no accelerator exists

  def __post_init__(self):
    for key in ("trainer_devices", "generator_devices"):
      v = getattr(self, key)
      _check(v > 0, f"mesh.{key}", f"must be a count >= 1 or a fraction in (0, 1), got {v}")
      _check(v < 1 or float(v).is_integer(), f"mesh.{key}", f"a count must be whole, got {v}")
    for key in ("trainer_tp", "generator_tp", "trainer_ep", "generator_ep",
                "simulated_cpu_devices"):
      v = getattr(self, key)
      _check(v >= 1, f"mesh.{key}", f"must be >= 1, got {v}")


# The tasks whose domain is "code" by default (jaxrl_scale.data.code_problems.CODE_TASKS:
# config is the bottom layer, so the two names are repeated here).
_CODE_TASKS = ("code", "code_fraction")
_DOMAIN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@dataclasses.dataclass(frozen=True)
class SourceConfig:
  """One domain of a mixed-domain run: an entry of `data.sources`."""

  source: str = ""  # built-in task name, "tfds:NAME", or a .jsonl/.parquet path
  weight: float = 1.0  # share of the training prompts: weight / sum of all weights
  # This source's share of the SFT warm start's examples instead (null = `weight`; 0 = no
  # SFT on it). Domains learn at different speeds in SFT (the CPU demo's code task far
  # faster than its arithmetic), so a warm start on the RL mix can leave one domain solved
  # and another unlearned, neither of which RL can move.
  sft_weight: float | None = None
  # Reward function (verifier) of this source's prompts; null = the built-in task's own,
  # "math" for files and TFDS datasets.
  task: str | None = None
  # Domain name in the metric keys rollout/<name>/pass_rate and val/<name>/pass_rate
  # (lower-case letters, digits, '_' and '-'); null = "code" for code tasks, else "math".
  name: str | None = None
  prompt_field: str = "prompt"  # as data.prompt_field, for this source
  answer_field: str = "answer"  # as data.answer_field, for this source
  id_field: str | None = None  # as data.id_field, for this source
  solution_field: str | None = None  # as data.solution_field, for this source
  answer_format: Literal["raw", "gsm8k", "boxed"] = "raw"  # as data.answer_format
  num_train: int = 2000  # built-in tasks: prompts generated for this source
  num_validation: int = 64  # this domain's own held-out prompts, split by data.seed

  @property
  def domain(self) -> str:
    """The domain name: `name`, else derived from the task (code tasks -> "code")."""
    if self.name is not None:
      return self.name
    task = self.task if self.task is not None else self.source.split("/")[0]
    return "code" if task in _CODE_TASKS else "math"


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Prompt source: a built-in task, a TFDS dataset or a local JSONL/Parquet file."""

  source: str = "arithmetic"  # built-in task name, "tfds:NAME", or a .jsonl/.parquet path
  data_dir: str | None = None  # TFDS data_dir (prepared datasets)
  prompt_field: str = "prompt"  # record field holding the prompt text
  answer_field: str = "answer"  # record field holding the reference answer
  id_field: str | None = None  # record field with a unique id; null = derived from the row
  solution_field: str | None = None  # worked solutions for the SFT warm start
  # How the answer field reads: "raw" as is, "gsm8k" (after '####'), "boxed" (last \boxed{}).
  answer_format: Literal["raw", "gsm8k", "boxed"] = "raw"
  task: str = "math"  # reward function for local / TFDS prompts (built-in tasks set their own)
  num_train: int = 2000  # built-in tasks: prompts generated
  num_validation: int = 64  # held-out prompts, split by seed
  max_prompt_tokens: int = 64  # longer prompts (after the template) are dropped and counted
  chat_template: bool = True  # use tokenizer_config.json's template when present
  seed: int = 0  # built-in tasks' generation, the held-out split and the epoch order
  # Mixed-domain training (e.g. math + code): a list of sources, each a mapping with its own
  # source, weight, task (verifier), name (domain) and the per-source keys of SourceConfig.
  # Batches mix them by weight; rollout and validation metrics are also logged per domain,
  # each domain with its own held-out set. Empty = the single source above. When set,
  # data.source, the field keys, data.task, data.num_train and data.num_validation above
  # must stay unset (they belong to each source).
  sources: tuple[SourceConfig, ...] = ()

  def __post_init__(self):
    _check(self.num_validation >= 0, "data.num_validation", "must be >= 0")
    _check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", "must be >= 1")
    if self.sources:
      self._check_sources()

  def _check_sources(self) -> None:
    defaults = DataConfig()
    for key in ("source", "prompt_field", "answer_field", "id_field", "solution_field",
                "answer_format", "task", "num_train", "num_validation"):
      _check(getattr(self, key) == getattr(defaults, key), f"data.{key}",
             "is not used when data.sources is set: give it to each source instead")
    seen: dict[str, int] = {}
    for i, src in enumerate(self.sources):
      key = f"data.sources[{i}]"
      _check(bool(src.source), f"{key}.source", "must name a built-in task, 'tfds:NAME' or "
             "a .jsonl / .parquet file")
      _check(math.isfinite(src.weight) and src.weight > 0, f"{key}.weight",
             f"must be a number > 0, got {src.weight}")
      _check(src.sft_weight is None or (math.isfinite(src.sft_weight) and src.sft_weight >= 0),
             f"{key}.sft_weight", f"must be a number >= 0 or null, got {src.sft_weight}")
      _check(src.num_train >= 1, f"{key}.num_train", f"must be >= 1, got {src.num_train}")
      _check(src.num_validation >= 0, f"{key}.num_validation",
             f"must be >= 0, got {src.num_validation}")
      _check(src.name is None or _DOMAIN_NAME_RE.fullmatch(src.name) is not None,
             f"{key}.name", f"{src.name!r} is not a metric-key name (1-32 of a-z 0-9 _ -, "
             "starting with a letter or digit)")
      domain = src.domain
      _check(domain not in seen, f"{key}.name",
             f"domain {domain!r} is also data.sources[{seen.get(domain)}]'s: give each source "
             "a distinct name")
      seen[domain] = i


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Generation on the generator slice."""

  # Concurrent sequences of the whole job (continuous batching). Each host's generator
  # (one generator group per JAX process) holds num_slots / hosts of them, which must divide
  # evenly and then split over its mesh's 'data' axis; eval shares the same slots.
  num_slots: int = 64
  max_new_tokens: int = 32  # generation budget per completion, in tokens
  temperature: float = 1.0  # 0 = greedy
  top_p: float = 1.0  # nucleus sampling (1 = off; an RL run requires 1)
  top_k: int = 0  # 0 = off
  decode_chunk: int = 8  # decode steps per jitted call; weight swaps happen between chunks
  # Prompt lengths that prefill compiles for (a prompt pads to the next one); the largest
  # must hold data.max_prompt_tokens.
  prompt_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
  # Chunked prefill: prompt positions prefilled per engine iteration, between decode chunks,
  # so a long prompt's admission does not stall the live sequences for its whole prefill
  # and the prefill's activations are bounded by this many positions (0 = whole prompts).
  prefill_chunk: int = 0
  stop_strings: tuple[str, ...] = ()  # a completion ends at the first of these (text)
  # Paged KV cache: positions per page, and the positions the page pool of one generator
  # group holds (0 = every slot at its full length, so nothing is ever preempted). A pool
  # sized for the average length holds more slots in the same memory; when it runs out, the
  # newest sequence is preempted and restarts later (see generation/pages.py).
  page_size: int = 16
  kv_cache_tokens: int = 0  # positions of one generator group's page pool (0 = full)
  # On CPU and GPU, also hold every layer's weights as arrays of their own, cut out of the
  # stacked weights at each weight swap: one more copy of the layer weights in generator
  # memory, for faster decoding (XLA otherwise copies them out every step on GPU, every
  # decode chunk on CPU; README, Sampler). TPUs always keep one copy.
  layer_weight_copies: bool = True
  # Copies of the weights a generator holds across an update: 2 keeps the posted weights
  # beside the live ones and swaps at the first chunk boundary after they are computed
  # (decoding never waits); 1 stops at the next chunk boundary, frees the live weights and
  # only then places the new ones (one copy of generator memory less, for models whose
  # weights fit a generator group once but not twice; docs/sampler.md).
  weight_buffers: int = 2
  # Colocated roles only (the trainer and the generator on the same chips): after each round
  # of rollouts (and each SFT dev check) the sampler frees its page pool, per-layer copies and
  # weights (vLLM's sleep mode), so the train step has the chip; the weight update brings new
  # weights and the next round an empty pool. false keeps them allocated through the train
  # step (`plan` then counts them beside it). Ignored when the roles have their own chips.
  sleep_while_training: bool = True
  # Forced length interruption (paper sec. 4): at a thinking budget drawn uniformly from
  # [interrupt_min, interrupt_max] tokens, force the phrase, then answer within answer_budget.
  interrupt: bool = False
  interrupt_min: int = 0  # lowest thinking budget, in generated tokens
  interrupt_max: int = 0  # highest thinking budget (< max_new_tokens)
  answer_budget: int = 0  # tokens left for the answer after the forced phrase
  interrupt_phrase: str = (  # appended at the thinking budget
      "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>")

  def __post_init__(self):
    _check(self.num_slots >= 1, "sampler.num_slots", "must be >= 1")
    _check(self.max_new_tokens >= 1, "sampler.max_new_tokens", "must be >= 1")
    _check(self.temperature >= 0, "sampler.temperature", "must be >= 0")
    _check(0 < self.top_p <= 1, "sampler.top_p", f"must be in (0, 1], got {self.top_p}")
    _check(self.top_k >= 0, "sampler.top_k", "must be >= 0")
    _check(self.decode_chunk >= 1, "sampler.decode_chunk", "must be >= 1")
    _check(self.page_size >= 1, "sampler.page_size", "must be >= 1")
    _check(self.prefill_chunk >= 0, "sampler.prefill_chunk",
           f"must be >= 0 (0 = whole prompts), got {self.prefill_chunk}")
    _check(self.kv_cache_tokens >= 0, "sampler.kv_cache_tokens", "must be >= 0")
    _check(self.weight_buffers in (1, 2), "sampler.weight_buffers",
           f"must be 1 or 2, got {self.weight_buffers}")
    _check(self.interrupt_min <= self.interrupt_max, "sampler.interrupt_min",
           "must be <= sampler.interrupt_max")
    _check(self.answer_budget >= 0, "sampler.answer_budget", "must be >= 0")
    if self.interrupt:
      # A budget of 0 would force the phrase at the first token; one at or past
      # max_new_tokens would never be reached.
      _check(self.interrupt_min > 0, "sampler.interrupt_min",
             f"must be > 0 when sampler.interrupt is true, got {self.interrupt_min}")
      _check(self.interrupt_max < self.max_new_tokens, "sampler.interrupt_max",
             f"must be < sampler.max_new_tokens ({self.max_new_tokens}) when "
             f"sampler.interrupt is true, got {self.interrupt_max}")
      _check(self.interrupt_max + self.answer_budget <= self.max_new_tokens,
             "sampler.answer_budget",
             f"{self.answer_budget} does not fit: sampler.interrupt_max + answer_budget = "
             f"{self.interrupt_max + self.answer_budget} > sampler.max_new_tokens "
             f"({self.max_new_tokens})")


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


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """Multi-turn episodes: an environment answers each model turn (docs/environments.md).

  The environment's tokens are masked from the loss; its episode reward (or the task's
  verifier on the last model turn) is the sample's reward. Rollouts and validation evals
  both run episodes.
  """

  name: str = ""  # a registered environment (python_tool, retry); "" = one turn, no env
  max_turns: int = 4  # model turns per episode
  max_tokens: int = 0  # tokens after the prompt, model and environment (0 = max_new_tokens)
  tool_call_s: float = 2.0  # wall-clock seconds one tool call may run
  tool_episode_s: float = 10.0  # tool seconds per episode, all calls together
  tool_output_chars: int = 1024  # longer tool output keeps its head and tail
  # The environment's own options as key=value (the value read as YAML), e.g.
  # ["attempts=3", "discount=1.0"] for retry; see its factory in jaxrl_scale/envs/.
  options: tuple[str, ...] = ()
  workers: int = 8  # threads running environment steps off the decode loop

  def __post_init__(self):
    _check(self.max_turns >= 1, "env.max_turns", "must be >= 1")
    _check(self.max_tokens == 0 or self.max_tokens >= 2, "env.max_tokens",
           "must be 0 (sampler.max_new_tokens) or >= 2")
    _check(self.tool_call_s > 0, "env.tool_call_s", "must be > 0")
    _check(self.tool_episode_s > 0, "env.tool_episode_s", "must be > 0")
    _check(self.tool_output_chars >= 1, "env.tool_output_chars", "must be >= 1")
    _check(self.workers >= 1, "env.workers", "must be >= 1")
    for option in self.options:
      _check("=" in option and option.split("=", 1)[0].strip().isidentifier(), "env.options",
             f"entries are key=value, got {option!r}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Validation during training: mean@k pass rate on the held-out prompts (val/pass_rate)."""

  every: int = 10  # steps between validation evals (0 = off)
  samples_per_prompt: int = 4  # mean@k
  temperature: float = 1.0  # sampling temperature of the eval completions (0 = greedy)
  max_prompts: int = 0  # validation prompts used (0 = all held-out prompts)
  # Downstream benchmark files "PATH[:NAME]" (AIME-style math / LiveCodeBench-style code
  # jsonl, as `jaxrl-scale eval` reads them), logged as downstream/<NAME>/pass@k, mean@n.
  downstream: tuple[str, ...] = ()
  downstream_every: int = 0  # steps between downstream evals (0 = off); a multiple of eval.every
  downstream_samples: int = 4  # n samples per benchmark problem; pass@1 and pass@n are logged

  def __post_init__(self):
    _check(self.every >= 0, "eval.every", "must be >= 0")
    _check(self.samples_per_prompt >= 1, "eval.samples_per_prompt", "must be >= 1")
    _check(self.temperature >= 0, "eval.temperature", "must be >= 0")
    _check(self.max_prompts >= 0, "eval.max_prompts", "must be >= 0")
    _check(self.downstream_every >= 0, "eval.downstream_every", "must be >= 0")
    _check(self.downstream_samples >= 1, "eval.downstream_samples", "must be >= 1")
    _check(not self.downstream_every or self.downstream, "eval.downstream",
           "lists no benchmark files, but eval.downstream_every is set")
    _check(not self.downstream_every or (self.every and self.downstream_every % self.every == 0),
           "eval.downstream_every",
           f"must be a multiple of eval.every={self.every} (downstream evals run on eval steps)")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Orbax checkpoints of the whole run state in the run directory, and preemption."""

  every: int = 50  # steps between checkpoints (0 = only at the end and on signals)
  keep: int = 3  # newest checkpoints kept; older ones are deleted
  async_save: bool = True  # write checkpoints in the background while training goes on
  # After SIGTERM/SIGINT the run saves and exits; past this many seconds a watchdog ends it
  # (exit 1, earlier checkpoints intact). 30 s is a preemptible VM's notice; 0 = no deadline.
  preempt_grace_seconds: float = 30.0

  def __post_init__(self):
    _check(self.every >= 0, "checkpoint.every", "must be >= 0")
    _check(self.keep >= 1, "checkpoint.keep", "must be >= 1")
    _check(self.preempt_grace_seconds >= 0, "checkpoint.preempt_grace_seconds", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class ForecastConfig:
  """Live sigmoid forecast of the validation pass rate (scaling/)."""

  enabled: bool = True  # refit the sigmoid after every eval (forecast/* metrics)
  axis: str = "flops"  # compute axis: flops (model FLOPs, steady under load) or hours
  target_compute_hours: float | None = None  # default: the run's projected total
  min_compute_hours: float = 0.0  # points below this are excluded from the fit
  n_boot: int = 200  # bootstrap refits per eval for the intervals (0 = none)
  plot: bool = True  # write forecast.png at the end of the run

  def __post_init__(self):
    _check(self.axis in ("flops", "hours"), "forecast.axis",
           f"must be 'flops' or 'hours', got {self.axis!r}")
    _check(self.n_boot >= 0, "forecast.n_boot", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class Config:
  run: RunConfig = RunConfig()
  model: ModelSpec = ModelSpec()
  mesh: MeshConfig = MeshConfig()
  data: DataConfig = DataConfig()
  sampler: SamplerConfig = SamplerConfig()
  rl: RLConfig = RLConfig()
  optim: OptimConfig = OptimConfig()
  sft: SFTConfig = SFTConfig()
  pipeline: PipelineConfig = PipelineConfig()
  env: EnvConfig = EnvConfig()
  eval: EvalConfig = EvalConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  forecast: ForecastConfig = ForecastConfig()

  def __post_init__(self):
    # A Config describes an RL run (`jaxrl-scale generate` takes a SamplerConfig alone).
    # The trainer's log-probs are log-softmax(logits / temperature) over the whole
    # vocabulary; with top-k / top-p the sampler draws from a truncated, renormalised
    # distribution, so the importance ratio pi_train / pi_gen would compare two different
    # distributions.
    _check(self.sampler.top_p == 1.0, "sampler.top_p",
           f"must be 1 in an RL run, got {self.sampler.top_p} (the trainer's log-probs "
           "cover the whole vocabulary; a truncated sampler makes the importance ratio wrong)")
    _check(self.sampler.top_k == 0, "sampler.top_k",
           f"must be 0 in an RL run, got {self.sampler.top_k} (the trainer's log-probs "
           "cover the whole vocabulary; a truncated sampler makes the importance ratio wrong)")
    seq_len = self.data.max_prompt_tokens + self.sampler.max_new_tokens
    _check(not self.optim.sequence_parallel or seq_len % self.mesh.trainer_tp == 0,
           "optim.sequence_parallel",
           f"the sequence length {seq_len} (data.max_prompt_tokens + sampler.max_new_tokens) "
           f"does not split over mesh.trainer_tp={self.mesh.trainer_tp}")
    _check(self.env.max_tokens <= self.sampler.max_new_tokens, "env.max_tokens",
           f"must be at most sampler.max_new_tokens={self.sampler.max_new_tokens} (the "
           f"sampler ends every sequence there), got {self.env.max_tokens}")
    _check(not self.env.name or self.model.routing == "own", "env.name",
           "multi-turn episodes do not record routing yet: use model.routing=own")


# ----------------------------------------------------------------------------------------
# Loading (`config_io` builds any of these dataclasses from dicts, YAML and overrides).

to_dict = config_io.to_dict
parse_overrides = config_io.parse_overrides
read_yaml = config_io.read_yaml
_coerce = config_io._coerce  # pylint: disable=protected-access


def from_dict(data: dict, cls=Config):
  """Builds `cls` from a nested dict of overrides on top of the defaults."""
  return config_io.from_dict(data, cls)


def load(path: str | pathlib.Path | None = None, overrides: list[str] = (), cls=Config):
  """Defaults, then the YAML file at `path` (if any), then dotted `overrides`."""
  return config_io.load(path, overrides, cls)


def replace(cfg, **changes):
  """dataclasses.replace for dotted keys: replace(cfg, **{'rl.loss': 'grpo'})."""
  return config_io.replace(cfg, **changes)
