"""Validation: mean@k pass rate of the current policy on the held-out prompts.

mean@k (the paper's validation metric, notes sec. 7: 1,000 held-out prompts, mean@16)
samples k completions per prompt at the eval temperature and averages correctness over
all of them. Every eval uses the same per-sample seeds (common random numbers), so the
difference between two evals reflects the policy, not a new draw of the sampling noise.

Mixed-domain runs (data/mixture.py): the prompts carry their domain, and every metric
that defines the fit's points is also given per domain: val/<domain>/pass_rate (mean@k over
that domain's prompts), val/<domain>/pass_at_k, val/<domain>/num_prompts and
val/<domain>/samples_per_prompt; val/pass_rate stays the mean over all samples.

Several processes: each samples a disjoint share of the prompts (`shard`) on its own
generator devices, with the seeds the prompts have in the full list, and the per-process
counts are summed (`gather`); every process gets the same numbers, equal to what a single
process would compute up to float rounding of the length mean.

A sample whose verifier timed out or raised has no verdict (NaN reward): it is left out of
the pass rates, as training leaves it out of its group, and counted in val/invalid. Scored
as wrong, a verifier that fails under load would read as a policy that got worse, and the
forecast fitted on val/pass_rate would bend with it; with no verdict at all the pass rate
is NaN (null in metrics.jsonl) and the forecast skips the point.

A stop request (SIGTERM) interrupts the sampler's `generate` with `preempt.Interrupted`,
and the scoring of the samples once `stop` is given (`preempt.map_until_stopped`), which
`run` passes on: the eval is abandoned. Sharded, an interrupted process
still takes part in the exchange (so no process waits for it) and every process raises.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from jaxrl_scale import preempt
from jaxrl_scale.data import sources
from jaxrl_scale.generation import records

_EVAL_SALT = 0x5EED_E7A1  # keeps eval seeds apart from training seeds
_COUNT_KEYS = ("correct", "judged", "samples", "any_correct", "judged_prompts", "prompts")


def _rates(c: dict[str, float]) -> dict[str, float]:
  """pass_rate (mean@k over judged samples), pass_at_k (over prompts with a verdict),
  num_prompts and invalid (samples without a verdict) from summed `Evaluator._counts`."""
  nan = float("nan")
  return {"pass_rate": c["correct"] / c["judged"] if c["judged"] else nan,
          "pass_at_k": c["any_correct"] / c["judged_prompts"] if c["judged_prompts"] else nan,
          "num_prompts": c["prompts"], "invalid": c["samples"] - c["judged"]}


class Generator(Protocol):
  """What the Evaluator samples with (`engine.Sampler`, `pipeline.generator.PipelineSource`)."""

  version: int

  def generate(self, requests: Sequence[records.Request],
               on_progress: Callable[[int, int], None] | None = None,
               ) -> list[records.Completion]:
    """Completions of `requests`, in order; `on_progress(done, total)` as they finish."""

  def update_params(self, params: Any, version: int) -> None:
    """Posts weights for the next generations."""


class Evaluator:
  """mean@k on a fixed prompt set.

  Args:
    sampler: generates the completions: has `generate(requests)`, `update_params(params,
      version)` and `version`. An `engine.Sampler`, or in pipelined mode the
      `pipeline.generator.PipelineSource` whose thread drives the process's one Sampler
      (eval requests then run through that Sampler's stream, see its `generate`).
    prompts: the held-out prompts.
    scorer: has `score(prompt, completions) -> (rewards, correct, counts)`, e.g.
      `pipeline.rollouts.GroupScorer`.
    samples_per_prompt: k.
    temperature: sampling temperature of the eval.
    seed: base of the per-sample seeds.
    pool: thread pool that scores prompts in parallel.
    shard: (index, count): this process samples prompts index, index + count, ...
    gather: with count > 1, exchanges a dict of this process's counts with the other
      processes and returns all of them (e.g. `parallel.distributed.allgather`).
    stop: the run's stop request: scoring stops within 0.1 s of it (Interrupted).
    episode_for: the run's environment: each prompt's episode maker
      (pipeline/environment.py); None: single-turn completions.
  """

  def __init__(self, sampler: Generator, prompts: Sequence[sources.Prompt],
               scorer: Any, *, samples_per_prompt: int, temperature: float,
               seed: int = 0, pool: concurrent.futures.Executor | None = None,
               shard: tuple[int, int] = (0, 1),
               gather: Callable[[dict[str, float]], list[dict[str, float]]] | None = None,
               stop: preempt.StopRequest | None = None,
               episode_for: Callable[[sources.Prompt], Any] | None = None):
    if samples_per_prompt < 1:
      raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    self.sampler = sampler
    self.prompts = list(prompts)
    self.scorer = scorer
    self.k = samples_per_prompt
    self.temperature = temperature
    self.seed = (seed ^ _EVAL_SALT) & 0x7FFFFFFF
    self.pool = pool
    index, count = shard
    if not 0 <= index < count:
      raise ValueError(f"shard {shard}: index outside [0, count)")
    if count > 1 and gather is None:
      raise ValueError("a sharded eval needs `gather` to combine the processes' counts")
    self.shard = (index, count)
    self.gather = gather
    self.stop = stop
    self.episode_for = episode_for
    # Mixed-domain prompts' domains, in order of appearance ("" = single-source: none).
    self.domains = [d for d in dict.fromkeys(p.domain for p in self.prompts) if d]

  def _request(self, i: int, j: int) -> records.Request:
    """Sample j of prompt i (its seed fixed by the eval's seed, prompt and sample)."""
    p = self.prompts[i]
    return records.Request(p.token_ids, prompt_id=i, sample_index=j,
                           seed=records.sequence_seed(self.seed, i, j),
                           temperature=self.temperature,
                           episode=self.episode_for(p) if self.episode_for is not None else None)

  def _score(self, prompts: Sequence[int], completions: Sequence[records.Completion]
             ) -> tuple[np.ndarray, np.ndarray]:
    """(correct [N, k], judged [N, k]) of prompts `prompts` (indices) whose k completions
    each follow in `completions`; judged: the verifier gave a verdict (finite reward)."""

    def one(n: int) -> tuple[np.ndarray, np.ndarray]:
      rewards, correct, _ = self.scorer.score(self.prompts[prompts[n]],
                                              completions[n * self.k:(n + 1) * self.k])
      correct = np.asarray(correct, bool)
      # A scorer without rewards (None) judges every sample.
      judged = (np.ones_like(correct) if rewards is None
                else np.isfinite(np.asarray(rewards, np.float64)))
      return correct & judged, judged

    pairs = preempt.map_until_stopped(one, range(len(prompts)), self.pool, self.stop)
    return np.stack([c for c, _ in pairs]), np.stack([j for _, j in pairs])

  @staticmethod
  def _counts(correct_NK: np.ndarray, judged_NK: np.ndarray) -> dict[str, float]:
    """Sums the pass rates are made of: a prompt counts for pass@k once it has a verdict."""
    any_judged = judged_NK.any(axis=1)
    return {"correct": float(correct_NK.sum()), "judged": float(judged_NK.sum()),
            "samples": float(judged_NK.size), "any_correct": float(correct_NK.any(axis=1).sum()),
            "judged_prompts": float(any_judged.sum()), "prompts": float(len(judged_NK))}

  def _domain_counts(self, indices: Sequence[int], correct_NK: np.ndarray | None,
                     judged_NK: np.ndarray | None) -> dict[str, float]:
    """Per-domain `_counts` over prompts `indices` (rows of the arrays); zeros without them."""
    counts = {}
    for d in self.domains:
      rows = np.array([self.prompts[i].domain == d for i in indices], bool)
      if correct_NK is None or not rows.any():
        mine = self._counts(np.zeros((0, self.k), bool), np.zeros((0, self.k), bool))
      else:
        mine = self._counts(correct_NK[rows], judged_NK[rows])
      counts.update({f"{d}/{k}": v for k, v in mine.items()})
    return counts

  def _domain_metrics(self, counts: dict[str, float]) -> dict[str, float]:
    """val/<domain>/... from `_domain_counts` (summed over processes)."""
    out = {}
    for d in self.domains:
      rates = _rates({k: counts[f"{d}/{k}"] for k in _COUNT_KEYS})
      out.update({f"val/{d}/{k}": v for k, v in rates.items()})
      out[f"val/{d}/samples_per_prompt"] = float(self.k)
    return out

  def run(self, params: Any = None, version: int | None = None,
          on_progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Samples and scores; `params` (if given) are loaded into the sampler first.

    `on_progress(done, total)`: completions sampled so far (this process's share when
    sharded), passed to the sampler's `generate`.

    Returns:
      val/pass_rate (mean@k over the samples with a verdict), val/pass_at_k (prompts with
      any correct sample), val/invalid (samples without a verdict), val/length_mean,
      val/truncated_frac, val/num_prompts, val/samples_per_prompt, val/seconds; with
      mixed-domain prompts also val/<domain>/pass_rate, pass_at_k, invalid, num_prompts
      and samples_per_prompt.
    """
    if not self.prompts:
      return {}
    if self.shard[1] > 1:
      return self._run_sharded(params, version, on_progress)
    t0 = time.perf_counter()
    if params is not None:
      self.sampler.update_params(params, self.sampler.version if version is None else version)
    requests = [self._request(i, j) for i in range(len(self.prompts)) for j in range(self.k)]
    completions = self._generate(requests, on_progress)
    indices = range(len(self.prompts))
    correct_NK, judged_NK = self._score(indices, completions)
    lengths = np.array([c.num_tokens for c in completions], np.float32)
    by_domain = self._domain_metrics(self._domain_counts(indices, correct_NK, judged_NK))
    return {
        **by_domain,
        **{f"val/{k}": v for k, v in _rates(self._counts(correct_NK, judged_NK)).items()},
        "val/length_mean": float(lengths.mean()),
        "val/truncated_frac": float(np.mean([c.truncated for c in completions])),
        "val/samples_per_prompt": float(self.k),  # with num_prompts: the fit's binomial se
        "val/seconds": time.perf_counter() - t0,
    }

  def _generate(self, requests: list[records.Request],
                on_progress: Callable[[int, int], None] | None) -> list[records.Completion]:
    if on_progress is None:  # any `generate(requests)` will do
      return self.sampler.generate(requests)
    return self.sampler.generate(requests, on_progress=on_progress)

  def _run_sharded(self, params: Any, version: int | None,
                   on_progress: Callable[[int, int], None] | None) -> dict[str, float]:
    """This process's share of the prompts, then the counts of all processes summed."""
    t0 = time.perf_counter()
    if params is not None:  # every process, even one without prompts: it is a collective
      self.sampler.update_params(params, self.sampler.version if version is None else version)
    index, count = self.shard
    mine = list(range(index, len(self.prompts), count))
    counts = {**dict.fromkeys(_COUNT_KEYS, 0.0), "tokens": 0.0, "truncated": 0.0,
              "interrupted": 0.0}
    counts.update(self._domain_counts(mine, None, None))  # every process sends every key
    completions = None
    if mine:
      requests = [self._request(i, j) for i in mine for j in range(self.k)]
      try:
        completions = self._generate(requests, on_progress)
      except preempt.Interrupted:
        counts["interrupted"] = 1.0
    if completions is not None:
      try:
        correct_NK, judged_NK = self._score(mine, completions)
      except preempt.Interrupted:
        counts["interrupted"] = 1.0
      else:
        counts.update(self._counts(correct_NK, judged_NK),
                      tokens=float(sum(c.num_tokens for c in completions)),
                      truncated=float(sum(bool(c.truncated) for c in completions)))
        counts.update(self._domain_counts(mine, correct_NK, judged_NK))
    counts["seconds"] = time.perf_counter() - t0
    parts = self.gather(counts)
    if any(p["interrupted"] for p in parts):
      raise preempt.Interrupted()
    total = {k: sum(p[k] for p in parts) for k in counts if k != "seconds"}
    samples = max(total["samples"], 1.0)
    return {
        **self._domain_metrics(total),
        **{f"val/{k}": v for k, v in _rates({k: total[k] for k in _COUNT_KEYS}).items()},
        "val/length_mean": total["tokens"] / samples,
        "val/truncated_frac": total["truncated"] / samples,
        "val/samples_per_prompt": float(self.k),
        "val/seconds": max(p["seconds"] for p in parts),
    }
