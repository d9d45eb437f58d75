"""A random RL batch (the train-step tests that need one without caring what it holds)."""

import numpy as np

from jaxrl_scale.rl import batch as batch_lib


def rl_batch(seed: int, *, prompts: int, generations: int, seq_len: int, prompt_len: int,
             vocab: int = 64) -> batch_lib.TrainBatch:
  """`prompts` x `generations` completions of 2 .. seq_len - prompt_len random tokens after
  prompts of `prompt_len`, with sampler log-probs in [-6, -2] and N(0, 1) advantages."""
  rng = np.random.default_rng(seed)
  ps = [list(rng.integers(1, vocab, size=prompt_len)) for _ in range(prompts)]
  completions = [[list(rng.integers(1, vocab, size=rng.integers(2, seq_len - prompt_len + 1)))
                  for _ in range(generations)] for _ in range(prompts)]
  gen_logp = [[list(-rng.uniform(2.0, 6.0, size=len(c))) for c in cs] for cs in completions]
  return batch_lib.pack_rl(ps, completions, gen_logp, rng.normal(size=(prompts, generations)),
                           seq_len=seq_len)
