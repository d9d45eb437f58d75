"""Validation: mean@k pass rate of the current policy on the held-out prompts.

mean@k (the paper's validation metric, notes sec. 7: 1,000 held-out prompts, mean@16)
samples k completions per prompt at the eval temperature and averages correctness over
all of them. Every eval uses the same per-sample seeds (common random numbers), so the
difference between two evals reflects the policy, not a new draw of the sampling noise.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_scale.data import sources
from jaxrl_scale.generation import engine
from jaxrl_scale.generation import records

_EVAL_SALT = 0x5EED_E7A1  # keeps eval seeds apart from training seeds


class Evaluator:
  """mean@k on a fixed prompt set.

  Args:
    sampler: generates the completions (a separate instance from the training generator's
      in pipelined mode, since a Sampler is driven by one thread at a time).
    prompts: the held-out prompts.
    scorer: has `score(prompt, completions) -> (rewards, correct, counts)`, e.g.
      `pipeline.rollouts.GroupScorer`.
    samples_per_prompt: k.
    temperature: sampling temperature of the eval.
    seed: base of the per-sample seeds.
    pool: thread pool that scores prompts in parallel.
  """

  def __init__(self, sampler: engine.Sampler, prompts: Sequence[sources.Prompt],
               scorer: Any, *, samples_per_prompt: int, temperature: float,
               seed: int = 0, pool: concurrent.futures.Executor | None = None):
    if samples_per_prompt < 1:
      raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    self.sampler = sampler
    self.prompts = list(prompts)
    self.scorer = scorer
    self.k = samples_per_prompt
    self.temperature = temperature
    self.seed = (seed ^ _EVAL_SALT) & 0x7FFFFFFF
    self.pool = pool

  def run(self, params: Any = None, version: int | None = None) -> dict[str, float]:
    """Samples and scores; `params` (if given) are loaded into the sampler first.

    Returns:
      val/pass_rate (mean@k), val/pass_at_k (prompts with any correct sample),
      val/length_mean, val/truncated_frac, val/num_prompts, val/seconds.
    """
    if not self.prompts:
      return {}
    t0 = time.perf_counter()
    if params is not None:
      self.sampler.update_params(params, self.sampler.version if version is None else version)
    requests = [
        records.Request(p.token_ids, prompt_id=i, sample_index=j,
                        seed=records.sequence_seed(self.seed, i, j),
                        temperature=self.temperature)
        for i, p in enumerate(self.prompts) for j in range(self.k)]
    completions = self.sampler.generate(requests)
    per_prompt = [completions[i * self.k:(i + 1) * self.k] for i in range(len(self.prompts))]

    def score(i: int) -> np.ndarray:
      return self.scorer.score(self.prompts[i], per_prompt[i])[1]

    indices = range(len(self.prompts))
    correct = list(self.pool.map(score, indices) if self.pool else map(score, indices))
    correct_NK = np.stack(correct)
    lengths = np.array([c.num_tokens for c in completions], np.float32)
    return {
        "val/pass_rate": float(correct_NK.mean()),
        "val/pass_at_k": float(correct_NK.any(axis=1).mean()),
        "val/length_mean": float(lengths.mean()),
        "val/truncated_frac": float(np.mean([c.truncated for c in completions])),
        "val/num_prompts": float(len(self.prompts)),
        "val/seconds": time.perf_counter() - t0,
    }
