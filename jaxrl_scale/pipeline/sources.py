"""Where the trainer's groups come from, per mode: the synchronous and PPO-off-policy-k
sources, and the admission bookkeeping every mode shares (the pipelined source is in
generator.py).

Every source answers `next_groups(version)` with P scored groups for the trainer at policy
version `version`, and `after_step(groups, params, version)` once it has trained on them.

  sync            generate P groups with the current policy, train one step, repeat; the
                  generator and the trainer never overlap (the paper's on-policy baseline).
  ppo_offpolicy   generate k * P groups with one policy, then take k steps on P-group
                  mini-batches (paper sec. 3.1: PPO-off-policy-k, used by Qwen3/ProRL).
  colocated       sync on one device set shared by both roles (small machines).

Admission (`Admitter`): each group gets a sequence number that seeds its G samples, and the
data position from just before its prompt was drawn is remembered until the trainer has
used the group. Every mode trains the groups in admission order, so the groups trained on
are always a prefix of the sequence numbers; a checkpoint stores the position of the
oldest group not yet trained on, and a resumed run regenerates exactly the groups that
were not trained on, none twice (in sync mode, with the same seeds, exactly the same
samples).

Several processes (`ProcessShard`): each process runs its own source on its own generator
devices and produces P / num_processes groups per step from a disjoint part of the prompt
stream (prompts are assigned to processes by a hash of their id, so the split needs no
coordination and each process's data position resumes exactly), with its own seeds; the
training loop exchanges the groups so that every process trains on all P.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jaxrl_scale import preempt
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine
from jaxrl_scale.generation import records
from jaxrl_scale.pipeline import rollouts


class RolloutSource(Protocol):
  """What the training loop asks of a mode."""

  def next_groups(self, version: int) -> list[rollouts.Group]:
    """P scored groups for the trainer at `version` (blocks until they exist)."""

  def after_step(self, groups: Sequence[rollouts.Group], params: Any, version: int) -> None:
    """The trainer finished the step on `groups` that produced `version` with `params`."""

  def state(self) -> dict[str, Any]:
    """Data position and sequence counter for a checkpoint (see `Admitter.state`)."""

  def metrics(self, version: int) -> dict[str, float]:
    """Per-step numbers: generator throughput, idle time, staleness in queue / flight."""

  def close(self) -> None:
    """Stops background work; safe to call twice."""


class ProcessShard:
  """Which part of the rollout work one process of a multi-process run does.

  Args:
    index: this process (0-based).
    count: number of processes.
  """

  def __init__(self, index: int = 0, count: int = 1):
    if not 0 <= index < count:
      raise ValueError(f"process index {index} outside [0, {count})")
    self.index = index
    self.count = count

  def owns(self, prompt_id: str) -> bool:
    """Whether this process generates for training prompt `prompt_id` (a stable hash)."""
    if self.count == 1:
      return True
    digest = hashlib.blake2b(str(prompt_id).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % self.count == self.index

  def share(self, prompts_per_step: int) -> int:
    """This process's groups per step: P / count (P must divide evenly)."""
    if prompts_per_step % self.count:
      raise UserError(f"config key 'rl.prompts_per_step': {prompts_per_step} does not split "
                      f"evenly over {self.count} processes (each generates the same share)")
    return prompts_per_step // self.count

  def seed(self, seed: int) -> int:
    """This process's sampling seed: `seed` itself in process 0 (single-process runs keep
    their seeds), a distinct stable derivative elsewhere."""
    if self.index == 0:
      return seed
    return zlib.crc32(f"{seed}/process/{self.index}".encode("utf-8")) & 0x7FFFFFFF

  def keep_hook(self, keep: Any = None) -> Any:
    """A PromptSource keep hook: this process's prompts that `keep` (if given) accepts."""
    if self.count == 1:
      return keep
    return lambda prompt_id: self.owns(prompt_id) and (keep is None or keep(prompt_id))


class Admitter:
  """Draws prompts, numbers groups, and remembers where each group's prompt came from.

  Thread-safe: the pipelined generator admits from its thread while the trainer thread
  marks groups consumed and reads the checkpoint state.
  """

  def __init__(self, prompts: data_sources.PromptSource, group_size: int, seed: int,
               next_seq: int = 0,
               episode_for: Callable[[data_sources.Prompt], Any] | None = None):
    self.prompts = prompts
    self.episode_for = episode_for  # the run's environment (pipeline/environment.py)
    self.group_size = group_size
    self.seed = seed
    self._next_seq = next_seq
    self._outstanding: dict[int, tuple[dict[str, int], int]] = {}
    self._consumed_max = -1  # highest sequence number trained on
    self._lock = threading.Lock()

  def admit(self, version: int) -> tuple[int, data_sources.Prompt, list[records.Request]]:
    """(seq, prompt, G requests) for the next group; `version` is the policy admitting it."""
    with self._lock:
      position = self.prompts.state_dict()
      prompt = next(self.prompts)
      seq = self._next_seq
      self._next_seq += 1
      self._outstanding[seq] = (position, version)
    episode = self.episode_for(prompt) if self.episode_for is not None else None
    requests = [records.Request(prompt.token_ids, prompt_id=seq, sample_index=g,
                                seed=records.sequence_seed(self.seed, seq, g), episode=episode)
                for g in range(self.group_size)]
    return seq, prompt, requests

  def consumed(self, seqs: Sequence[int]) -> None:
    """The trainer has used (or dropped) these groups for good."""
    with self._lock:
      for seq in seqs:
        self._outstanding.pop(seq, None)
        self._consumed_max = max(self._consumed_max, seq)

  @property
  def num_outstanding(self) -> int:
    with self._lock:
      return len(self._outstanding)

  @property
  def next_seq(self) -> int:
    """The sequence number the next admitted group gets."""
    with self._lock:
      return self._next_seq

  def outstanding_versions(self) -> list[int]:
    with self._lock:
      return [v for _, v in self._outstanding.values()]

  def state(self) -> dict[str, Any]:
    """{"data": position before the oldest unconsumed group, "next_seq": its number}."""
    with self._lock:
      if self._outstanding:
        seq = min(self._outstanding)
        if self._consumed_max > seq:
          # A resume from here would train groups seq+1.. twice.
          raise RuntimeError(f"group {self._consumed_max} was trained on before group {seq}: "
                             "the checkpoint cannot resume exactly")
        return {"data": dict(self._outstanding[seq][0]), "next_seq": seq}
      return {"data": self.prompts.state_dict(), "next_seq": self._next_seq}

  def load_state(self, state: dict[str, Any]) -> None:
    """Continues from `state()` of an earlier run over the same data."""
    with self._lock:
      self.prompts.load_state_dict(state["data"])
      self._next_seq = int(state["next_seq"])
      self._outstanding.clear()
      self._consumed_max = self._next_seq - 1


class RoundSource:
  """Synchronous rounds: generate `rounds * P` groups with one policy, hand them out P at
  a time. rounds = 1 is the synchronous mode, rounds = k PPO-off-policy-k.

  Args:
    sampler: on the generator slice (or the shared devices when colocated).
    admitter: prompt source and bookkeeping.
    scorer: verifiers.
    num_prompts: P, groups per trainer step.
    rounds: mini-batches per generation round (k).
    pool: thread pool that scores groups in parallel.
    stop: the run's stop request: scoring a round stops within 0.1 s of it (Interrupted,
      as an interrupted generation), not after every verifier call of the round.
    sleep: colocated roles (`sampler.sleep_while_training`): the sampler frees its device
      memory once a round is generated (`engine.Sampler.sleep`), so the train steps that
      follow have the chips; the update after the round's last step brings new weights.
  """

  def __init__(self, sampler: engine.Sampler, admitter: Admitter,
               scorer: rollouts.GroupScorer, num_prompts: int, rounds: int = 1,
               pool: concurrent.futures.Executor | None = None,
               stop: preempt.StopRequest | None = None, sleep: bool = False):
    self.sampler = sampler
    self.sleep = sleep
    self.sleep_s = 0.0  # freeing the sampler's memory (waits for its last programs)
    self.admitter = admitter
    self.scorer = scorer
    self.num_prompts = num_prompts
    self.rounds = rounds
    self.pool = pool
    self.stop = stop
    self._buffer: list[list[rollouts.Group]] = []
    self._start = time.perf_counter()
    self.generate_s = 0.0  # generator busy (sampling)
    self.score_s = 0.0
    self._tokens = 0
    self._last = (0.0, 0, time.perf_counter())

  def _generate_round(self) -> None:
    version = self.sampler.version
    admitted = [self.admitter.admit(version) for _ in range(self.num_prompts * self.rounds)]
    requests = [r for _, _, reqs in admitted for r in reqs]
    t0 = time.perf_counter()
    completions = self.sampler.generate(requests)
    t1 = time.perf_counter()
    if self.sleep:
      self.sampler.sleep()
      self.sleep_s += time.perf_counter() - t1
      t1 = time.perf_counter()
    g = self.admitter.group_size
    items = [(seq, prompt, completions[i * g:(i + 1) * g], version)
             for i, (seq, prompt, _) in enumerate(admitted)]
    groups = self.scorer.groups(items, self.pool, stop=self.stop)
    self.score_s += time.perf_counter() - t1
    self.generate_s += t1 - t0
    self._tokens += sum(c.num_tokens for c in completions)
    p = self.num_prompts
    self._buffer = [groups[i * p:(i + 1) * p] for i in range(self.rounds)]

  def next_groups(self, version: int) -> list[rollouts.Group]:
    del version  # a round's data is as fresh as the policy that generated it
    if not self._buffer:
      self._generate_round()
    return self._buffer.pop(0)

  def after_step(self, groups: Sequence[rollouts.Group], params: Any, version: int) -> None:
    self.admitter.consumed([g.seq for g in groups])
    # PPO-off-policy-k keeps the round's policy for all k mini-batches; the sampler gets
    # new weights only when the next round starts. Pushed now, not then: the next train
    # step donates `params`.
    if not self._buffer:
      self.sampler.update_params(params, version)

  def state(self) -> dict[str, Any]:
    return self.admitter.state()

  def metrics(self, version: int) -> dict[str, float]:
    del version
    now = time.perf_counter()
    gen_s, tokens, t = self._last
    self._last = (self.generate_s, self._tokens, now)
    busy = self.generate_s - gen_s
    return {
        "gen/tokens_per_s": (self._tokens - tokens) / busy if busy > 0 else 0.0,
        "gen/busy_s": busy,
        "gen/idle_frac": max(0.0, 1.0 - busy / (now - t)) if now > t else 0.0,
    }

  def close(self) -> None:
    pass
