"""Config sections of generation: `sampler` (the generator's engine), `env` (multi-turn
episodes) and `eval` (validation and downstream evals during training).

Part of `jaxrl_scale.config`, which assembles the sections into one `Config`.
"""

from __future__ import annotations

import dataclasses

from jaxrl_scale import config_io

_check = config_io.check


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
  # Batch sizes a decode chunk may run at: num_slots, then its halves (down to 4 rows), this
  # many in all; a chunk runs on the smallest that holds its live rows (a batch's tail). Each
  # is one more decode program to compile. null: 4 on CPU, whose decode matmuls are bound by
  # compute (a tail of 8 live rows in 64 slots costs about half a full chunk), 1 elsewhere.
  # A generator whose slots split over several devices always runs all of them.
  decode_row_buckets: int | None = None
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
    _check(self.decode_row_buckets is None or self.decode_row_buckets >= 1,
           "sampler.decode_row_buckets", f"must be >= 1 or null, got {self.decode_row_buckets}")
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
