"""End to end: the real Sampler (tiny random Qwen2) runs registered environments over
several turns; what the environment appended sits in the episode as its chat-template
delta, masked from the loss."""

import numpy as np

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.envs import base, registry
from jaxrl_scale.generation import engine, records

FEEDBACK = "No."
ATTEMPTS = 3


def _runs(mask):
  """(start, end) of each run of True in `mask`."""
  edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
  return list(zip(edges[::2], edges[1::2]))


def test_sampler_runs_retry_episodes_over_several_turns(tiny_model):
  model, tok = tiny_model
  end = tok.token_to_id("<|im_end|>")
  # Turns end quickly at temperature 1: a third of the bytes and <|im_end|> end a turn.
  eos = tuple(range(0, 256, 3)) + (end,)
  cfg = SamplerConfig(num_slots=4, max_new_tokens=96, temperature=1.0, decode_chunk=4,
                      prompt_buckets=(32,))
  sampler = engine.Sampler(model, cfg, eos_ids=eos)
  record = {"task": "arithmetic", "answer": "46"}
  prompt = tok.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=True)
  limits = base.Limits(max_turns=ATTEMPTS, max_tokens=cfg.max_new_tokens)
  reqs = [records.Request(prompt, prompt_id=0, sample_index=i, episode=registry.episode_maker(
      "retry", record, prompt, tok, limits, attempts=ATTEMPTS, feedback=FEEDBACK))
          for i in range(4)]
  reqs.append(records.Request(prompt, prompt_id=1, episode=registry.episode_maker(
      "python_tool", record, prompt, tok, limits)))
  outs = sampler.generate(reqs)

  tail = f"\n<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n"
  multi = 0
  for out in outs[:4]:
    mask = out.env_mask
    runs = _runs(mask)
    assert len(runs) == out.turns - 1 and out.env_stats["turns"] == out.turns
    for start, stop in runs:
      # The turn before ended on <|im_end|> (the delta goes on after it) or on another
      # end id (the delta closes the turn first).
      closed = out.tokens[start - 1] == end
      want = tok.encode(tail if closed else "<|im_end|>" + tail)
      assert out.tokens[start:stop].tolist() == want
    assert (out.logprobs[mask] == 0).all() and not out.trainable[mask].any()
    assert out.trainable[~mask].all()
    assert out.env_stats["env_tokens"] == mask.sum()
    if not out.truncated:  # a random policy never writes 46: every attempt is spent
      assert out.turns == ATTEMPTS and out.reward == -1.0 and out.correct is False
      assert out.answer_start == runs[-1][1]
      multi += 1
  assert multi >= 2
  assert sampler.stats.resumes == sum(o.turns - 1 for o in outs)
  # No tool call from a random policy: one turn, left to the task's verifier.
  tool = outs[4]
  assert tool.turns == 1 and tool.reward is None and not tool.env_mask.any()
  assert tool.env_stats["tool_calls"] == 0
