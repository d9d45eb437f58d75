"""What goes into the sampler (Request) and what comes out (Completion), plus stop strings.

Everything here is host-side NumPy and plain Python: the RL pipeline consumes Completions
without touching JAX, and the stop-string scan runs on the host between decode chunks.
"""

from __future__ import annotations

import dataclasses
import os
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from jaxrl_scale.errors import UserError

# Finish reasons. "interrupted" means the forced-interruption phrase was appended at the
# thinking budget (whatever ended the answer afterwards); `Completion.truncated` says
# whether the sequence ran out of tokens instead of ending on EOS or a stop string.
EOS = "eos"
STOP = "stop"
LENGTH = "length"
INTERRUPTED = "interrupted"
FINISH_REASONS = (EOS, STOP, LENGTH, INTERRUPTED)
NEVER = 2**30  # force_at value of a sequence that is never interrupted


@dataclasses.dataclass(frozen=True)
class Request:
  """One sequence to generate.

  Attributes:
    prompt_tokens: the prompt's token ids (BOS and chat template already applied).
    prompt_id: identifies the prompt (an int or str); the RL pipeline groups on it.
    sample_index: which of the G samples of this prompt this is.
    seed: per-sequence seed. None derives one from the sampler seed, prompt_id and
      sample_index, so the same request gives the same tokens whatever slot it lands in.
    temperature, top_p, top_k, max_new_tokens: per-request overrides of the sampler config.
      max_new_tokens bounds the whole completion: of an episode, every model and
      environment token after the prompt.
    episode: makes this sequence's environment episode (`Episode`), called each time the
      sequence starts (again after a preemption); None: one turn, no environment (the
      one-turn case of the same path).
  """

  prompt_tokens: Sequence[int]
  prompt_id: Any = 0
  sample_index: int = 0
  seed: int | None = None
  temperature: float | None = None
  top_p: float | None = None
  top_k: int | None = None
  max_new_tokens: int | None = None
  episode: Callable[[], Episode] | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class Turn:
  """One model turn of an episode, as the environment sees it.

  Attributes:
    tokens: int32 ids the policy wrote in this turn (its end token included).
    finish_reason: EOS or STOP (a turn cut by the token budget ends the episode instead).
    index: 0 for the first turn.
  """

  tokens: np.ndarray
  finish_reason: str
  index: int


@dataclasses.dataclass(frozen=True)
class EnvStep:
  """What an environment answers after a model turn: tokens to append, or the end.

  Attributes:
    tokens: ids to append (a tool result, feedback, the next user turn, already rendered
      with the model's chat template as a delta); the policy then writes its next turn.
      Empty when `done`.
    done: the episode ends here.
    reward: the episode's reward (NaN: no verdict, an invalid sample); None: the task's
      verifier scores the final turn's text, as for a single-turn completion.
    correct: whether the episode counts as solved (with `reward`).
  """

  tokens: Sequence[int] = ()
  done: bool = False
  reward: float | None = None
  correct: bool | None = None

  def __post_init__(self):
    if self.done == bool(len(self.tokens)):
      raise ValueError("EnvStep: give tokens to append, or done=True (not both, not neither)")


class Episode(Protocol):
  """One sequence's environment state (jaxrl_scale/envs/ builds them).

  `step` runs on the sampler's environment threads, never on its decode loop: a slow
  tool holds only its own sequence. It must not raise for anything the model wrote; if
  it does, the episode ends with reward NaN (invalid: no verdict)."""

  def step(self, turn: Turn) -> EnvStep:
    ...

  def summary(self) -> dict[str, float]:
    """Counters of the episode so far (tool_calls, tool_errors, tool_timeouts, tool_s)."""
    ...


@dataclasses.dataclass
class Completion:
  """A finished sequence. Per-token arrays all have the same length T.

  Attributes:
    tokens: int32 [T] generated ids (sampled and forced; EOS included when it ended on EOS).
    logprobs: float32 [T] log-probability of each token under its sampling distribution
      (see generation/sampling.py; forced tokens get the tempered model logprob).
    versions: int32 [T] policy version whose weights produced each token.
    forced: bool [T] True for tokens of the forced-interruption phrase (exclude from loss).
    finish_reason: one of FINISH_REASONS.
    truncated: ended by a token budget (max new tokens or the answer budget).
    text: decoded generated text when the sampler has a tokenizer.
    env_mask: bool [T] True on tokens an environment appended (no log-prob: 0, no loss);
      None: none (a single-turn completion).
    turns: model turns (1 for a single-turn completion).
    answer_start: index in `tokens` where the last model turn starts (what the task's
      verifier scores when the environment left the reward to it).
    reward, correct: the environment's episode reward and verdict; None: verify the last
      turn (`EnvStep.reward`).
    env_stats: the episode's counters (`Episode.summary`), empty without an environment.
    routing: with routing records on (an MoE sampler's `record_routing`), the experts the
      sampler's model sent each position's token to: [P - 1 + T, L, K] (L sparse layers,
      top-K; uint8 up to 256 experts) for the P - 1 + T positions it fed through the model
      (every prompt token, every generated token but the last), position order; None
      otherwise.
  """

  prompt_id: Any
  sample_index: int
  prompt_tokens: np.ndarray
  tokens: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  forced: np.ndarray
  finish_reason: str
  truncated: bool
  text: str | None = None
  routing: np.ndarray | None = None
  env_mask: np.ndarray | None = None
  turns: int = 1
  answer_start: int = 0
  reward: float | None = None
  correct: bool | None = None
  env_stats: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def num_tokens(self) -> int:
    return int(self.tokens.shape[0])

  @property
  def trainable(self) -> np.ndarray:
    """bool [T]: the tokens the policy sampled, which take loss: neither forced
    interruption tokens nor environment tokens."""
    out = ~np.asarray(self.forced, bool)
    if self.env_mask is not None:
      out &= ~np.asarray(self.env_mask, bool)
    return out

  @property
  def num_env_tokens(self) -> int:
    return 0 if self.env_mask is None else int(np.sum(self.env_mask))


def sequence_seed(base_seed: int, prompt_id: Any, sample_index: int) -> int:
  """A 31-bit seed from stable hashes (Python's hash() is salted per process)."""
  pid = zlib.crc32(repr(prompt_id).encode("utf-8"))
  return zlib.crc32(f"{base_seed}/{pid}/{sample_index}".encode("utf-8")) & 0x7FFFFFFF


class TokenBuffer:
  """Growing per-sequence token record, filled chunk by chunk on the host."""

  def __init__(self, request: Request, seed: int, force_at: int, limit: int):
    self.request = request
    self.seed = seed
    self.force_at = force_at
    self.limit = limit  # token budget: the sequence ends on the device by this many steps
    self.steps_dispatched = 0  # decode steps sent to the device since admission
    self.prefilled = False  # its whole prompt is in the cache: it decodes from now on
    self.tokens: list[int] = []
    self.logprobs: list[float] = []
    self.versions: list[int] = []
    self.forced: list[bool] = []
    self.done = False
    # Routing records (`record_routing`): one [L, K] array per generated token (the experts
    # of the step that produced it), and the prefill pieces' device outputs, read back at
    # the end: (routing_uTLK, prompt row, first position).
    self.routing: list[np.ndarray] = []
    self.prompt_routing: list[tuple[Any, int, int]] = []
    # Episodes (generation/episodes.py): the environment's state, which tokens it wrote,
    # the model turns so far, where the current turn starts, and `turn` as counted by
    # the chunks in flight (a chunk dispatched in an earlier turn is skipped).
    self.episode: Episode | None = request.episode() if request.episode is not None else None
    self.env: list[bool] = []
    self.turns = 1
    self.turn_start = 0
    self.turn = 0
    self.awaiting_env = False  # its turn ended; the environment has not answered yet
    self.parked: int | None = None  # its pages' handle while out of a slot (PagePool.park)
    self.slot = -1  # the slot it last decoded in
    self.order = 0  # admission order (preemption takes the most recent first)
    self.end: EnvStep | None = None
    self.last_reason = EOS  # how its last model turn ended

  @property
  def surely_done(self) -> bool:
    """The dispatched steps cover the whole budget, so the device has finished (or will)."""
    return self.steps_dispatched >= self.limit and not self.awaiting_env

  def extend(self, tokens, logprobs, forced, version: int) -> None:
    self.tokens.extend(int(t) for t in tokens)
    self.logprobs.extend(float(x) for x in logprobs)
    self.forced.extend(bool(f) for f in forced)
    self.versions.extend([version] * len(tokens))
    self.env.extend([False] * len(tokens))

  def extend_env(self, tokens: Sequence[int]) -> None:
    """Appends an environment's tokens: no log-prob (0), not forced, the version of the
    turn before them (they never make the sequence look older than it is)."""
    version = self.versions[-1] if self.versions else 0
    n = len(tokens)
    self.tokens.extend(int(t) for t in tokens)
    self.logprobs.extend([0.0] * n)
    self.forced.extend([False] * n)
    self.versions.extend([version] * n)
    self.env.extend([True] * n)

  def extend_routing(self, routing_NLK: np.ndarray) -> None:
    self.routing.extend(routing_NLK)

  def truncate(self, n: int) -> None:
    del self.tokens[n:], self.logprobs[n:], self.versions[n:], self.forced[n:]
    del self.routing[n:], self.env[n:]

  def routing_record(self) -> np.ndarray | None:
    """The Completion's `routing`: the prompt's P - 1 prefilled positions, then one per
    generated token; None when nothing was recorded."""
    if not self.prompt_routing and not self.routing:
      return None
    pieces = sorted(self.prompt_routing, key=lambda p: p[2])
    prompt = [np.asarray(arr)[row] for arr, row, _ in pieces]  # [T, L, K] each
    p = len(self.request.prompt_tokens) - 1
    parts = ([np.concatenate(prompt)[:p]] if prompt else []) + (
        [np.stack(self.routing)] if self.routing else [])
    return np.concatenate(parts)

  def finish(self, reason: str, decode: Callable[[list[int]], str] | None) -> Completion:
    self.done = True
    was_forced = any(self.forced)
    truncated = reason == LENGTH
    return Completion(
        prompt_id=self.request.prompt_id,
        sample_index=self.request.sample_index,
        prompt_tokens=np.asarray(self.request.prompt_tokens, np.int32),
        tokens=np.asarray(self.tokens, np.int32),
        logprobs=np.asarray(self.logprobs, np.float32),
        versions=np.asarray(self.versions, np.int32),
        forced=np.asarray(self.forced, bool),
        finish_reason=INTERRUPTED if was_forced else reason,
        truncated=truncated,
        text=decode(self.tokens) if decode is not None else None,
        routing=self.routing_record(),
        env_mask=np.asarray(self.env, bool) if self.episode is not None else None,
        turns=self.turns,
        answer_start=self.turn_start,
        reward=None if self.end is None else self.end.reward,
        correct=None if self.end is None else self.end.correct,
        env_stats=dict(self.episode.summary()) if self.episode is not None else {},
    )


def new_buffer(req: Request, cfg: Any, *, longest_prompt: int, vocab: int, base_seed: int,
               record_routing: bool = False) -> TokenBuffer:
  """A request's token record, once the request is checked (UserError naming the request
  and what is wrong with it: an empty or too long prompt, token ids outside the vocabulary,
  a sampling override out of range).

  Args:
    req: the request.
    cfg: the sampler config (`SamplerConfig`).
    longest_prompt: the sampler's longest prompt bucket.
    vocab: the model's vocabulary size.
    base_seed: the sampler's seed (a request without its own derives one from it).
    record_routing: the sampler keeps routing records (no episodes then).
  """
  n = len(req.prompt_tokens)
  name = f"request prompt_id={req.prompt_id!r}"
  if n == 0:
    raise UserError(f"{name}: empty prompt")
  if n > longest_prompt:
    raise UserError(f"{name}: prompt has {n} tokens, more than the sampler's longest prompt "
                    f"bucket ({longest_prompt})")
  if min(req.prompt_tokens) < 0 or max(req.prompt_tokens) >= vocab:
    raise UserError(f"{name}: token ids must be in [0, {vocab})")
  if req.max_new_tokens is not None and not 1 <= req.max_new_tokens <= cfg.max_new_tokens:
    raise UserError(f"{name}: max_new_tokens must be in "
                    f"[1, sampler.max_new_tokens={cfg.max_new_tokens}]")
  for key, value, ok in (
      ("temperature", req.temperature, lambda v: v >= 0),
      ("top_p", req.top_p, lambda v: 0 < v <= 1),
      ("top_k", req.top_k, lambda v: v >= 0)):
    if value is not None and not ok(value):
      raise UserError(f"{name}: invalid {key} {value}")
  if req.episode is not None and record_routing:
    raise UserError(f"{name}: multi-turn episodes do not record routing yet (sampler "
                    "record_routing with an MoE model)")
  seed = req.seed if req.seed is not None else sequence_seed(
      base_seed, req.prompt_id, req.sample_index)
  force_at = NEVER
  if cfg.interrupt:
    rng = np.random.default_rng([seed, 0x1A7E])
    force_at = int(rng.integers(cfg.interrupt_min, cfg.interrupt_max + 1))
  limit = cfg.max_new_tokens if req.max_new_tokens is None else req.max_new_tokens
  return TokenBuffer(req, seed=seed & 0x7FFFFFFF, force_at=force_at, limit=limit)


@dataclasses.dataclass
class Stats:
  """Counters over the sampler's lifetime (reset with `Sampler.reset_stats`)."""

  tokens: int = 0  # valid generated tokens read back
  sequences: int = 0
  chunks: int = 0
  admissions: int = 0
  slot_steps: int = 0  # num_slots * decode steps dispatched (capacity)
  preemptions: int = 0  # sequences stopped for want of pages, restarted later
  prefill_tokens: int = 0  # prompt positions the prefill programs computed (padding included)
  prefill_pieces: int = 0  # prefill programs run (one per admission without chunked prefill)
  mixed_chunks: int = 0  # decode chunks dispatched while a chunked prefill was under way
  row_chunks: int = 0  # decode chunks run on fewer rows than slots (sampler.decode_row_buckets)
  unshared_prefill_tokens: int = 0  # what they would have been with one prefill per row
  seconds: float = 0.0  # wall time inside stream()
  turns: int = 0  # model turns ended (single-turn sequences count one each)
  env_calls: int = 0  # environment steps run (one per turn an episode did not end on)
  env_s: float = 0.0  # seconds the environment steps took, summed over their threads
  env_errors: int = 0  # environment steps that raised (the episode ends, reward NaN)
  resumes: int = 0  # episodes continued in place after their environment's tokens
  resume_tokens: int = 0  # positions those continuations prefilled (padding excluded)
  moved_resumes: int = 0  # continuations in another slot than their turn ended in
  evictions: int = 0  # parked episodes whose pages went to others (they prefill again)
  reprefill_tokens: int = 0  # positions of histories prefilled again after an eviction

  @property
  def tokens_per_second(self) -> float:
    return self.tokens / self.seconds if self.seconds > 0 else 0.0

  @property
  def slot_utilisation(self) -> float:
    return self.tokens / self.slot_steps if self.slot_steps else 0.0


def throttled(report: Callable[[int, int, float], None], *, first_s: float, every_s: float,
              clock: Callable[[], float] | None = None) -> Callable[[int, int], None]:
  """An `on_progress(done, total)` for the samplers' `generate` that calls
  `report(done, total, seconds since it was made)` first after `first_s`, then at most every
  `every_s`, and never for the last completion (callers say how it ended)."""
  clock = clock or time.perf_counter
  start = clock()
  due = [start + first_s]

  def on_progress(done: int, total: int) -> None:
    now = clock()
    if now >= due[0] and done < total:
      due[0] = now + every_s
      report(done, total, now - start)

  return on_progress


class StopStrings:
  """Finds the first token at which a stop string completes in the generated text.

  Only a tail of earlier tokens is decoded with each new chunk, so the scan costs
  O(chunk + window) per chunk rather than O(sequence length).
  """

  def __init__(self, stop_strings: Sequence[str], decode: Callable[[list[int]], str]):
    self.stops = tuple(s for s in stop_strings if s)
    self.decode = decode
    # A token yields at least one byte of text or none; a stop string of n bytes spans at
    # most n tokens that yield text, so a tail this long covers any straddling match.
    longest = max((len(s.encode("utf-8")) for s in self.stops), default=0)
    self.window = 2 * longest + 8

  def __bool__(self) -> bool:
    return bool(self.stops)

  def _completes(self, tail: list[int], new: list[int]) -> bool:
    before = self.decode(tail)
    text = self.decode(tail + new)
    # Text that `new` changed starts where the two decodings diverge (not at len(before):
    # a trailing partial UTF-8 character decodes to U+FFFD until its last byte arrives).
    # A match ending inside the common prefix was already there.
    common = len(os.path.commonprefix([before, text]))
    for stop in self.stops:
      i = text.find(stop, max(0, common - len(stop) + 1))
      if i != -1 and i + len(stop) > common:
        return True
    return False

  def first_stop(self, tokens: list[int], num_old: int) -> int | None:
    """Index of the token completing a stop string among tokens[num_old:], or None."""
    if not self.stops or num_old >= len(tokens):
      return None
    tail = tokens[max(0, num_old - self.window):num_old]
    if not self._completes(tail, tokens[num_old:]):
      return None
    for j in range(num_old, len(tokens)):
      if self._completes(tail, tokens[num_old:j + 1]):
        return j
    return None


def text_rules(cfg: Any, tokenizer: Any, think_end_id: int | None,
               ) -> tuple[Callable | None, StopStrings, tuple[int, ...], int]:
  """What the sampler needs of its tokenizer (cfg: the sampler config section): (the
  Completion.text decoder, the stop strings, the forced-interruption phrase's tokens, the
  id that ends thinking or -1). Completion.text drops special tokens (EOS, padding); stop
  strings see the raw text."""
  decode_text = ((lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
                 if tokenizer is not None else None)
  if cfg.stop_strings and tokenizer is None:
    raise UserError("config key 'sampler.stop_strings': stop strings need a tokenizer")
  stops = StopStrings(cfg.stop_strings,
                      tokenizer.decode if tokenizer is not None else (lambda ids: ""))
  phrase, think_end = [], -1
  if cfg.interrupt:
    if tokenizer is None:
      raise UserError("config key 'sampler.interrupt': forced interruption needs a tokenizer")
    phrase = tokenizer.encode(cfg.interrupt_phrase)
    if not phrase:
      raise UserError("config key 'sampler.interrupt_phrase': encodes to no tokens")
    end_id = tokenizer.token_to_id("</think>") if think_end_id is None else think_end_id
    think_end = -1 if end_id is None else int(end_id)
  return decode_text, stops, tuple(int(t) for t in phrase), think_end
