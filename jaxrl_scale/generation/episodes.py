"""Multi-turn episodes in the sampler: environment calls off the decode loop, and the
continuation of a sequence in place from its paged KV cache.

A request with an `episode` (records.Request) runs turn by turn, in whichever slot is free:

  1. the policy writes a turn; it ends on EOS or a stop string as any completion does;
  2. the sequence leaves its slot and keeps its pages (`PagePool.park`), and the
     episode's `step` runs on one of this module's threads: a slow tool holds neither a
     slot nor the decode loop, and the slot takes the next waiting sequence at once;
  3. the environment answers with tokens to append (`records.EnvStep`), or the end;
  4. the tokens join the sequence as environment tokens (no log-prob, no loss) and the
     sequence resumes where it stopped, in the first free slot of its pages' data shard
     (answered episodes go before new requests; `PagePool.unpark` moves only the table
     row, the cache stays where it is): one prefill piece computes only the positions
     that are not in the cache yet (the turn's last token and the new tokens but the
     last, which the next decode step feeds), attending to the history through the
     slot's pages (`decode.resume_program`: the history's length is traced, so one
     program serves every turn). Then it decodes in the same continuous batch as every
     first turn.

A single-turn request is the one-turn case of the same path: its turn ends, there is no
episode to step, and it finishes.

The token budget (`max_new_tokens`) counts the whole completion, model and environment
tokens alike: the device stops a turn at it as for a single turn, and the episode ends
truncated (today's truncation rules: no reward from a fallback answer). The same holds
when the environment's tokens leave no room for another model token. A turn that ends
after its slot's pages were already given back (the last chunk before the budget was in
flight) also ends the episode as truncated. When a shard lacks the pages a continuation
needs, the episode is preempted like any sequence and restarts from its prompt with a
fresh episode (the same seed: with the same weights and a deterministic environment, the
same episode).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import time
from collections.abc import Iterator

import numpy as np

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import decode, records

log = logging.getLogger(__name__)

MIN_PIECE = 8  # shortest compiled continuation piece (positions); longer ones are powers of 2


@dataclasses.dataclass
class _Call:
  buf: records.TokenBuffer
  future: concurrent.futures.Future


class EnvCalls:
  """The environment steps in flight, one per episode whose turn ended.

  Args:
    workers: threads running `Episode.step` (the Python tool's sandboxed runs mostly
      wait on their child process, so more threads than cores pay off).
  """

  def __init__(self, workers: int = 8):
    self.workers = workers
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._calls: list[_Call] = []

  def __len__(self) -> int:
    return len(self._calls)

  def submit(self, buf: records.TokenBuffer, reason: str, stats: records.Stats) -> None:
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(self.workers,
                                                         thread_name_prefix="env")
    turn = records.Turn(tokens=np.asarray(buf.tokens[buf.turn_start:], np.int32),
                        finish_reason=reason, index=buf.turns - 1)
    episode = buf.episode

    def run() -> tuple[records.EnvStep | BaseException, float]:
      t0 = time.perf_counter()
      try:
        out: records.EnvStep | BaseException = episode.step(turn)
        if not isinstance(out, records.EnvStep):
          raise TypeError(f"Episode.step returned {type(out).__name__}, not an EnvStep")
      except Exception as e:  # noqa: BLE001 - the episode ends invalid, the run goes on
        out = e
      return out, time.perf_counter() - t0

    buf.awaiting_env = True
    stats.env_calls += 1
    self._calls.append(_Call(buf, self._pool.submit(run)))

  def ready(self, stats: records.Stats) -> list[tuple[records.TokenBuffer, records.EnvStep]]:
    """The answers that arrived, in submission order. A step that raised becomes the end
    of its episode with reward NaN (no verdict)."""
    out, keep = [], []
    for call in self._calls:
      if not call.future.done():
        keep.append(call)
        continue
      step, seconds = call.future.result()
      stats.env_s += seconds
      if isinstance(step, BaseException):
        stats.env_errors += 1
        log.warning("environment step failed (episode ends, no verdict): %s: %s",
                    type(step).__name__, step)
        step = records.EnvStep(done=True, reward=math.nan, correct=False)
      call.buf.awaiting_env = False
      out.append((call.buf, step))
    self._calls = keep
    return out

  def drop(self, buf: records.TokenBuffer) -> None:
    """Forgets the call of `buf` (preempted or abandoned); its answer is ignored."""
    self._calls = [c for c in self._calls if c.buf is not buf]

  def wait(self, timeout: float) -> None:
    """Blocks until an answer arrives or `timeout` seconds pass."""
    if self._calls:
      concurrent.futures.wait([c.future for c in self._calls], timeout=timeout,
                              return_when=concurrent.futures.FIRST_COMPLETED)

  def clear(self) -> None:
    self._calls.clear()

  def close(self) -> None:
    self._calls.clear()
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)
      self._pool = None


class EpisodeSlots:
  """The Sampler's side of episodes (a mixin of engine.Sampler, which holds the state it
  uses: the page pool `_pool`, the calls `_env`, the answered episodes waiting for a slot
  `_answered`, the parked ones `_parked_eps` in parking order, the shards `_blocked` for
  new requests while an answered episode there waits for pages)."""

  def _env_answers(self, owners: list[records.TokenBuffer | None], admitted_at: list[int],
                   ) -> Iterator[tuple[records.Request, records.Completion]]:
    """Ends the episodes whose environment answered with the end, and continues the others
    in free slots, before any new request takes one. A continued episode
    that lacks pages waits out of a slot, and no new request starts on its shard meanwhile.
    """
    pool = self._pool
    if self._env:
      vocab = self.model_cfg.vocab_size
      for buf, step in self._env.ready(self.stats):
        if buf.done:  # abandoned meanwhile
          continue
        reason = buf.last_reason if step.done else apply_step(
            buf, step, vocab, self._think_end)
        if reason is None:
          self._answered.append(buf)
          continue
        if step.done:
          buf.end = step
        # The end, or no room left for the policy (truncated).
        self._unpark(buf)
        self.stats.sequences += 1
        yield buf.request, buf.finish(reason, self._decode_text)
    self._blocked.clear()
    if not self._answered:
      return
    free = [s for s, o in enumerate(owners) if o is None or o.surely_done]
    waiting = []
    for buf in self._answered:
      shard = None if buf.parked is None else pool.parked_shard(buf.parked)
      slot = next((s for s in free if shard in (None, pool.shard_of(s))), None)
      if slot is None:  # every slot is busy: it goes first when one frees
        waiting.append(buf)
        continue
      cached = buf.parked is not None
      self._unpark(buf, slot)
      need = self._positions_after_chunk(buf)
      while not pool.grow(slot, need):
        if not self._evict(pool.shard_of(slot)):
          break
      else:
        free.remove(slot)
        self.stats.moved_resumes += slot != buf.slot
        owners[slot], admitted_at[slot], buf.slot = buf, buf.order, slot
        self._resume(slot, buf, cached)
        continue
      # Too few pages: it waits with what it holds, first in line on its shard.
      if pool.held(slot):
        buf.parked = pool.park(slot)
        self._parked_eps.append(buf)
      self._blocked.add(pool.shard_of(slot))
      waiting.append(buf)
    self._answered = waiting

  def _unpark(self, buf: records.TokenBuffer, slot: int | None = None) -> None:
    """Puts a parked episode's pages into `slot`, or lets go of them (slot None)."""
    if buf.parked is None:
      return
    if slot is None:
      self._pool.drop_parked(buf.parked)
    else:
      self._pool.unpark(buf.parked, slot)
    buf.parked = None
    self._parked_eps.remove(buf)

  def _evict(self, shard: int) -> bool:
    """Drops the pages of the most recently parked episode on `shard` (it prefills its
    history again when it continues: no work is lost); False when there is none."""
    for buf in reversed(self._parked_eps):
      if self._pool.parked_shard(buf.parked) == shard:
        self._unpark(buf)
        self.stats.evictions += 1
        return True
    return False

  def _resume(self, slot: int, buf: records.TokenBuffer, cached: bool = True) -> None:
    """Continues `buf` in its slot: prefills only the positions its cache lacks (the whole
    history when its pages were evicted: `cached` False)."""
    adm, start, n = resume_admission(slot, buf, self.cfg, cached)
    if self._resume_fn is None:
      self._resume_fn = decode.resume_program(self._graphdef, self._param_treedef,
                                              self._state_shardings)
    self._state = self._resume_fn(self._param_leaves, self._state, adm, self._device_table(),
                                  np.int32(start))
    buf.prefilled = True
    self.stats.resumes += 1
    self.stats.resume_tokens += n
    self.stats.reprefill_tokens += 0 if cached else n


def apply_step(buf: records.TokenBuffer, step: records.EnvStep, vocab: int,
               think_end: int) -> str | None:
  """Appends an environment's answer to its sequence for the next turn (not `done`).

  Returns None when the sequence goes on (its slot must then grow and resume), or
  `records.LENGTH` when the tokens leave no room for another model token (truncated; the
  sequence is unchanged). A token id outside [0, vocab) is a UserError naming the request.
  """
  new = [int(t) for t in step.tokens]
  if min(new) < 0 or max(new) >= vocab:
    raise UserError(f"environment of request prompt_id={buf.request.prompt_id!r} "
                    f"appended a token id outside [0, {vocab})")
  if len(buf.tokens) + len(new) >= buf.limit:
    return records.LENGTH
  buf.extend_env(new)
  buf.turns += 1
  buf.turn += 1
  buf.turn_start = len(buf.tokens)
  buf.steps_dispatched = len(buf.tokens)
  buf.force_at = resume_force_at(buf, think_end)
  return None


def piece_length(n: int) -> int:
  """Compiled length of a continuation piece of n positions: a power of two >= MIN_PIECE."""
  return max(MIN_PIECE, decode.next_pow2(n))


def resume_force_at(buf: records.TokenBuffer, think_end: int) -> int:
  """Where the forced-interruption phrase starts in a continued episode: unchanged once
  it was forced (its answer budget still applies); never once thinking ended on its own
  (the device cancelled it then); at once when the environment's tokens ran past it."""
  if buf.force_at == decode.NEVER or any(buf.forced):
    return buf.force_at
  if think_end >= 0 and any(t == think_end and not e for t, e in zip(buf.tokens, buf.env)):
    return decode.NEVER
  return max(buf.force_at, len(buf.tokens))


def resume_admission(slot: int, buf: records.TokenBuffer, cfg: SamplerConfig,
                     cached: bool = True) -> tuple[decode.Admission, int, int]:
  """The device input that continues `buf` in its slot after environment tokens.

  The cache holds the history's positions [0, start) with start = P + len(tokens) - 1 -
  n_env (everything before the turn's last token); the piece writes [start, H - 1) and the
  first decode step feeds the last environment token at H - 1 (H: the history's length).
  With `cached` False (its pages were evicted) start is 0: the whole history goes in again.

  Returns:
    (admission (one row), start, positions computed).
  """
  req = buf.request
  history = list(req.prompt_tokens) + buf.tokens
  n_env = len(buf.tokens) - _last_model_index(buf) - 1
  start = len(history) - 1 - n_env if cached else 0
  new = history[start:-1]
  t = piece_length(len(new))
  tokens = np.zeros((1, t), np.int32)
  tokens[0, :len(new)] = new

  def one(value, dtype):
    return np.asarray([value], dtype)

  adm = decode.Admission(
      tokens_uT=tokens, length_u=one(len(history), np.int32), source_n=one(0, np.int32),
      slot_n=one(slot, np.int32), src_slot_u=one(slot, np.int32),
      activate_n=one(True, bool), last_n=one(history[-1], np.int32),
      seed_n=one(buf.seed, np.int32),
      temperature_n=one(cfg.temperature if req.temperature is None else req.temperature,
                        np.float32),
      top_k_n=one(cfg.top_k if req.top_k is None else req.top_k, np.int32),
      top_p_n=one(cfg.top_p if req.top_p is None else req.top_p, np.float32),
      limit_n=one(buf.limit, np.int32),
      force_at_n=one(buf.force_at, np.int32),
      answer_budget_n=one(cfg.answer_budget, np.int32),
      gen_n=one(len(buf.tokens), np.int32))
  return adm, start, len(new)


def _last_model_index(buf: records.TokenBuffer) -> int:
  """Index in buf.tokens of the last token the policy wrote."""
  for i in range(len(buf.env) - 1, -1, -1):
    if not buf.env[i]:
      return i
  raise ValueError("an episode resumes after a model turn")
