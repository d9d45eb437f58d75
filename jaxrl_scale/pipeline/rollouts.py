"""Rollouts: scored groups of completions, and their assembly into a fixed-shape TrainBatch.

A `Group` is one prompt with its G completions from the sampler, each carrying per-token
log-probs, policy versions and forced / environment flags, plus their rewards. Groups are
the unit that flows through the rollout queue: advantages are group-centred, so a group is
never split. A multi-turn episode is one completion: its reward is the environment's
verdict when it gave one, else the task verifier's verdict on the last model turn.

`build_batch` turns P groups into the `rl.batch.TrainBatch` the jitted step expects:
rewards -> group-centred advantages with the configured normalisation (ScaleRL: batch
std), zero-variance prompts weighted out of the loss, optional DAPO length penalty,
every token the policy did not sample (`Completion.trainable`: forced-interruption and
environment tokens) excluded from the loss, and the prompt axis padded to P with weight-0
rows so the step compiles once. Single- and multi-turn completions take the same path.

What is not a verdict never becomes one: a completion whose verifier timed out or raised
has reward NaN (invalid), which leaves it out of its group's advantage (rl/advantages.py);
a completion cut by its token budget earns nothing from a fallback answer (the verifier is
told it was truncated); a group with a non-finite generator log-prob on a trained token
is dropped (weight 0, counted in batch/dropped_nonfinite_groups) rather than poisoning the
whole step's loss, so the other groups still train.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_scale import preempt
from jaxrl_scale import rewards
from jaxrl_scale.config import RLConfig
from jaxrl_scale.data import sources
from jaxrl_scale.data import tasks
from jaxrl_scale.generation import records
from jaxrl_scale.rewards import scorer as scorer_lib
from jaxrl_scale.rl import advantages as advantages_lib
from jaxrl_scale.rl import batch as batch_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Group:
  """One prompt's G scored completions.

  Attributes:
    seq: admission number, unique in a run; seeds the sampler and orders the data.
    prompt: the prompt as the data layer produced it.
    completions: G sampler outputs (tokens, logprobs, versions, forced and environment
      flags).
    rewards_G: the environment's episode rewards where it gave one, else verifier rewards
      (rl.reward_correct / rl.reward_incorrect); NaN where there is no verdict (the
      verifier timed out or raised, the environment failed: an invalid sample, see
      `valid_G`).
    correct_G: which completions the environment or the verifier accepted.
    counts: verdict counts of this group (rewards.scorer.COUNT_KEYS).
    admitted_version: the sampler's policy version when the group was admitted.
  """

  seq: int
  prompt: sources.Prompt
  completions: list[records.Completion]
  rewards_G: np.ndarray
  correct_G: np.ndarray
  counts: dict[str, int]
  admitted_version: int

  @property
  def valid_G(self) -> np.ndarray:
    """Which completions have a verdict (False where the verifier timed out or raised)."""
    return np.isfinite(self.rewards_G)

  @property
  def nonfinite_logprobs(self) -> bool:
    """Whether a trained token (`Completion.trainable`) has a NaN or infinite generator
    log-prob."""
    return any(not np.isfinite(c.logprobs[c.trainable]).all() for c in self.completions)

  @property
  def versions(self) -> np.ndarray:
    """Policy versions of every generated token of the group, concatenated."""
    parts = [c.versions for c in self.completions if c.num_tokens]
    return np.concatenate(parts) if parts else np.zeros((0,), np.int32)

  @functools.cached_property
  def min_version(self) -> int:
    """Version of the group's oldest token (the admission version if it has none).

    Computed once (on the scoring thread, see `GroupScorer.group`), never under a lock.
    """
    v = self.versions
    return int(v.min()) if v.size else self.admitted_version


class GroupScorer:
  """Scores completions with the verifier of each prompt's task, never raising per item.

  Verifiers run on the `rewards.Scorer` worker threads (one Scorer per reward name, all
  with `num_threads` workers), so neither the generator nor the trainer runs them.
  """

  def __init__(self, rl: RLConfig, tokenizer: Any, *, num_threads: int = 4,
               timeout_s: float = 5.0):
    self.rl = rl
    self.tokenizer = tokenizer
    self.num_threads = num_threads
    self.timeout_s = timeout_s
    self._scorers: dict[str, rewards.Scorer] = {}
    self._lock = threading.Lock()

  def _scorer(self, task: str) -> rewards.Scorer:
    name = tasks.reward_name(task)
    with self._lock:
      if name not in self._scorers:
        self._scorers[name] = rewards.Scorer(
            name, correct_reward=self.rl.reward_correct,
            incorrect_reward=self.rl.reward_incorrect, timeout_s=self.timeout_s,
            num_threads=self.num_threads)
      return self._scorers[name]

  def text(self, completion: records.Completion) -> str:
    """The response the verifier sees: the last model turn's tokens (all generated tokens
    of a single-turn completion) without special tokens (EOS). The earlier turns and the
    environment's tokens are the episode's history, not its answer."""
    tokens = completion.tokens[completion.answer_start:]
    return self.tokenizer.decode(tokens.tolist(), skip_special_tokens=True)

  def score(self, prompt: sources.Prompt, completions: Sequence[records.Completion]
            ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(rewards [G], correct [G], verdict counts) for one prompt's completions.

    An episode whose environment gave its reward (`Completion.reward` not None) keeps it
    and its `correct` (None: correct when the reward reaches rl.reward_correct); counted
    as correct or wrong, or as an error when the reward is NaN (the environment failed: no
    verdict). The others' last model turn (`text`) goes to the task's verifier. Rewards
    are NaN where the verifier timed out or raised (no verdict); a completion that ran out
    of tokens is scored as truncated (no reward from a fallback answer).

    Completions with the same text (and truncation) are verified once and share the
    verdict: a converging policy repeats itself within a group, and each repeat of a code
    answer would cost a sandboxed process. The counts still count every completion.
    """
    counts = dict.fromkeys(scorer_lib.COUNT_KEYS, 0)
    rewards_G = np.zeros((len(completions),), np.float32)
    correct = np.zeros((len(completions),), bool)
    verify = []
    for j, c in enumerate(completions):
      if c.reward is None:
        verify.append(j)
        continue
      counts["total"] += 1
      rewards_G[j] = c.reward
      correct[j], key = scorer_lib.environment_verdict(c.reward, c.correct,
                                                       self.rl.reward_correct)
      counts[key] += 1
    if not verify:
      return rewards_G, correct, counts
    keys = [(self.text(completions[j]), bool(completions[j].truncated)) for j in verify]
    unique = list(dict.fromkeys(keys))
    result = self._scorer(prompt.task).score([(text, prompt.answer) for text, _ in unique],
                                             truncated=[cut for _, cut in unique])
    position = {key: i for i, key in enumerate(unique)}
    for j, key in zip(verify, keys):
      i = position[key]
      verdict = result.verdicts[i]
      counts["total"] += 1
      if verdict is not None:
        counts[verdict.reason] += 1
      else:
        counts["errors" if result.errors[i] is not None else "timeouts"] += 1
      rewards_G[j] = result.rewards[i]
      correct[j] = verdict is not None and verdict.correct
    return rewards_G, correct, counts

  def group(self, seq: int, prompt: sources.Prompt, completions: Sequence[records.Completion],
            admitted_version: int) -> Group:
    """Scores one prompt's completions into a Group (completions sorted by sample index)."""
    completions = sorted(completions, key=lambda c: c.sample_index)
    rewards_G, correct_G, counts = self.score(prompt, completions)
    group = Group(seq=seq, prompt=prompt, completions=list(completions), rewards_G=rewards_G,
                  correct_G=correct_G, counts=counts, admitted_version=admitted_version)
    group.min_version  # pylint: disable=pointless-statement  # cached here, off the queue lock
    return group

  def groups(self, items: Sequence[tuple[int, sources.Prompt, Sequence[records.Completion], int]],
             pool: concurrent.futures.Executor | None = None,
             stop: preempt.StopRequest | None = None) -> list[Group]:
    """Scores many groups, in parallel on `pool` when given; keeps the input order. With
    `stop`, raises Interrupted within 0.1 s of a stop request (`preempt.map_until_stopped`)."""
    return preempt.map_until_stopped(lambda item: self.group(*item), items, pool, stop)

  def close(self) -> None:
    with self._lock:
      for scorer in self._scorers.values():
        scorer.close()
      self._scorers.clear()


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """The fixed shape of every RL batch: [num_prompts, group_size, seq_len]."""

  num_prompts: int
  group_size: int
  seq_len: int
  pad_id: int


def _length_penalty(rl: RLConfig) -> advantages_lib.LengthPenalty | None:
  if not rl.length_penalty:
    return None
  return advantages_lib.LengthPenalty(max_length=rl.length_penalty_max,
                                      cache_length=rl.length_penalty_cache)


def domain_stats(groups: Sequence[Group], correct_PG: np.ndarray, judged_PG: np.ndarray,
                 domains: Sequence[str] = ()) -> dict[str, float]:
  """rollout/<domain>/pass_rate and rollout/<domain>/num_groups of a mixed-domain batch.

  Args:
    groups: the batch's groups; group i is row i of the [P, G] arrays.
    correct_PG: which samples the verifier accepted.
    judged_PG: which samples have a verdict (the pass rate's denominator, as overall).
    domains: the run's domains: each gets its keys even when absent from this batch
      (num_groups 0, pass_rate NaN), so every row has them. Domains of the groups that are
      not listed get theirs too; a single-source run's groups (domain "") get none.

  Returns:
    The per-domain metrics.
  """
  names = list(dict.fromkeys([*domains, *(g.prompt.domain for g in groups)]))
  out: dict[str, float] = {}
  for name in names:
    if not name:
      continue
    rows = np.array([g.prompt.domain == name for g in groups], bool)
    judged = judged_PG[:len(groups)] & rows[:, None]
    out[f"rollout/{name}/pass_rate"] = (float(correct_PG[:len(groups)][judged].mean())
                                        if judged.any() else float("nan"))
    out[f"rollout/{name}/num_groups"] = float(rows.sum())
  return out


# `Completion.env_stats` counters (`Episode.summary`) summed into rollout/<key> per step.
TOOL_KEYS = ("tool_calls", "tool_errors", "tool_timeouts", "tool_s")


def episode_stats(completions: Sequence[records.Completion]) -> dict[str, float]:
  """Multi-turn metrics of a step's completions; empty when none is an episode.

  An episode is a completion made with an environment (`env_mask` set) or of several
  turns; a run's every completion is one or none is, so its rows either all have these
  keys or none has.

  Returns:
    rollout/turns_mean and rollout/turns_max (model turns per episode);
    rollout/tool_calls, tool_errors, tool_timeouts and tool_s (tool seconds), summed
    over the step's episodes (`Completion.env_stats`, 0 where an episode has none), and
    rollout/tool_calls_mean per episode; rollout/env_token_frac, the share of generated
    tokens that an environment wrote (no loss).
  """
  episodes = [c for c in completions if c.env_mask is not None or c.turns > 1]
  if not episodes:
    return {}
  turns = np.array([c.turns for c in episodes], np.float32)
  out = {"rollout/turns_mean": float(turns.mean()), "rollout/turns_max": float(turns.max())}
  for key in TOOL_KEYS:
    out[f"rollout/{key}"] = float(sum(float(c.env_stats.get(key, 0.0)) for c in episodes))
  out["rollout/tool_calls_mean"] = out["rollout/tool_calls"] / len(episodes)
  tokens = sum(c.num_tokens for c in completions)
  out["rollout/env_token_frac"] = (sum(c.num_env_tokens for c in completions) / tokens
                                   if tokens else 0.0)
  return out


def _routing(groups: Sequence[Group]) -> list[list[np.ndarray]] | None:
  """The completions' routing records for `pack_rl` (an MoE sampler's `record_routing`),
  or None when they carry none."""
  if not groups or groups[0].completions[0].routing is None:
    return None
  return [[c.routing for c in grp.completions] for grp in groups]


def build_batch(groups: Sequence[Group], rl: RLConfig, shape: BatchShape,
                domains: Sequence[str] = ()
                ) -> tuple[batch_lib.TrainBatch, dict[str, float], np.ndarray]:
  """Advantages, filters and packing for one step.

  Args:
    groups: at most `shape.num_prompts` scored groups of `shape.group_size` completions.
    rl: loss-side settings (normalisation, zero-variance filter, length penalty).
    shape: the batch shape; missing groups become weight-0 padding rows.
    domains: a mixed-domain run's domains (`data.sources`): the rollout metrics are also
      logged per domain (`domain_stats`).

  Returns:
    (batch of NumPy arrays, rollout statistics, keep_P for the real groups: whether each
    group enters the loss).
  """
  p, g = shape.num_prompts, shape.group_size
  n = len(groups)
  if n > p:
    raise ValueError(f"{n} groups do not fit a batch of {p} prompts")
  for grp in groups:
    if len(grp.completions) != g:
      raise ValueError(f"group {grp.seq} has {len(grp.completions)} completions, expected {g}")
  rewards_PG = np.zeros((p, g), np.float32)
  correct_PG = np.zeros((p, g), bool)
  lengths_PG = np.zeros((p, g), np.int32)
  valid_PG = np.zeros((p, g), bool)
  nonfinite = np.zeros((n,), bool)
  for i, grp in enumerate(groups):
    rewards_PG[i] = grp.rewards_G
    correct_PG[i] = grp.correct_G
    lengths_PG[i] = [c.num_tokens for c in grp.completions]
    # A group is the unit of the advantage: one bad log-prob drops all of it (weight 0),
    # never the batch (a NaN loss skips the step) nor its own max IS weight (-inf).
    nonfinite[i] = grp.nonfinite_logprobs
    valid_PG[i] = ~nonfinite[i]
  if nonfinite.any():
    log.warning("dropped %d group(s) with non-finite generator log-probs (admission %s)",
                int(nonfinite.sum()), [grp.seq for grp, bad in zip(groups, nonfinite) if bad])
  adv = advantages_lib.compute_advantages(
      rewards_PG, normalization=rl.advantage_norm, valid_PG=valid_PG,
      filter_zero_variance=rl.zero_variance_filter, lengths_PG=lengths_PG,
      penalty=_length_penalty(rl), correct_PG=correct_PG)
  advantages_PG = np.asarray(adv.advantages_PG)
  weight_PG = np.asarray(adv.weight_PG)
  batch = batch_lib.pack_rl(
      [grp.prompt.token_ids for grp in groups],
      [[c.tokens for c in grp.completions] for grp in groups],
      [[c.logprobs for c in grp.completions] for grp in groups],
      advantages_PG[:n], seq_len=shape.seq_len, pad_id=shape.pad_id,
      trainable=[[c.trainable for c in grp.completions] for grp in groups],
      weights=weight_PG[:n], prompt_ids=[grp.seq % 2**31 for grp in groups],
      num_prompts=p, routing=_routing(groups))
  stats = {f"rollout/{k}": float(v) for k, v in adv.stats.items() if k != "num_invalid"}
  judged_PG = valid_PG & np.isfinite(rewards_PG)
  judged_any_PG = np.isfinite(rewards_PG) & (np.arange(p) < n)[:, None]  # log-probs aside
  stats["batch/dropped_nonfinite_groups"] = float(nonfinite.sum())
  # Groups the verifier's timeouts / errors left with fewer than 2 judged samples.
  stats["batch/dropped_invalid_groups"] = float(np.sum(
      ~nonfinite & (judged_PG[:n].sum(axis=1) < 2) & ~np.isfinite(rewards_PG[:n]).all(axis=1)))
  completions = [c for grp in groups for c in grp.completions]
  if completions:
    lengths = np.array([c.num_tokens for c in completions], np.float32)
    stats.update({
        # Of the judged samples (a verdict exists); NaN (written as null) when none is.
        "rollout/pass_rate": (float(correct_PG[judged_any_PG].mean()) if judged_any_PG.any()
                              else float("nan")),
        "rollout/length_mean": float(lengths.mean()),
        "rollout/length_max": float(lengths.max()),
        "rollout/truncated_frac": float(np.mean([c.truncated for c in completions])),
        "rollout/interrupted_frac": float(np.mean(
            [c.finish_reason == records.INTERRUPTED for c in completions])),
        "rollout/num_groups": float(n),
    })
    stats.update(domain_stats(groups, correct_PG, judged_any_PG, domains))
    stats.update(episode_stats(completions))
    counts: dict[str, int] = {}
    for grp in groups:
      for key, value in grp.counts.items():
        counts[key] = counts.get(key, 0) + value
    total = max(counts.get("total", 0), 1)
    for key in ("no_answer", "unparseable", "errors", "timeouts"):
      stats[f"rollout/{key}_frac"] = counts.get(key, 0) / total
    # Invalid samples (no verdict: left out of the advantages), by cause.
    stats["rewards/invalid"] = float(np.sum(~np.isfinite(rewards_PG[:n])))
    stats["rewards/timeouts"] = float(counts.get("timeouts", 0))
    stats["rewards/errors"] = float(counts.get("errors", 0))
  return batch, stats, np.asarray(adv.keep_P)[:n]
