import numpy as np
import pytest

from jaxrl_scale import config
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.pipeline import rollouts

TOK = tokenizer_lib.ByteTokenizer()


def _prompt(i, answer="5"):
  ids = tuple(TOK.encode(f"{i}+0=", add_special_tokens=True))
  return data_sources.Prompt(id=f"p{i}", task="arithmetic", prompt=f"{i}+0=", text=f"{i}+0=",
                             token_ids=ids, answer=answer, solution=answer)


def _completion(text, sample_index, version=0, forced=None, eos=True):
  tokens = TOK.encode(text) + ([TOK.EOS] if eos else [])
  n = len(tokens)
  return records.Completion(
      prompt_id=0, sample_index=sample_index, prompt_tokens=np.zeros((3,), np.int32),
      tokens=np.asarray(tokens, np.int32), logprobs=np.linspace(-1, -0.1, n).astype(np.float32),
      versions=np.full((n,), version, np.int32),
      forced=np.zeros((n,), bool) if forced is None else np.asarray(forced),
      finish_reason=records.EOS if eos else records.LENGTH, truncated=not eos)


def _group(seq, texts, rewards, **kw):
  comps = [_completion(t, j, **kw) for j, t in enumerate(texts)]
  r = np.asarray(rewards, np.float32)
  return rollouts.Group(seq=seq, prompt=_prompt(seq), completions=comps, rewards_G=r,
                        correct_G=r > 0, counts={"total": len(texts)}, admitted_version=0)


def test_scorer_uses_the_task_verifier_without_special_tokens():
  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=2)
  try:
    group = scorer.group(3, _prompt(3, answer="12"),
                         [_completion("12", 1), _completion("13", 0), _completion("x", 2)], 0)
  finally:
    scorer.close()
  assert [c.sample_index for c in group.completions] == [0, 1, 2]  # sorted
  np.testing.assert_array_equal(group.rewards_G, [-1.0, 1.0, -1.0])
  assert group.counts["correct"] == 1 and group.counts["no_answer"] == 1


def test_build_batch_advantages_filter_padding_and_forced_tokens():
  rl = config.RLConfig(advantage_norm="none", zero_variance_filter=True)
  shape = rollouts.BatchShape(num_prompts=3, group_size=2, seq_len=12, pad_id=TOK.PAD)
  forced = [True, False, False]  # "ab" + EOS: the first token was forced
  groups = [_group(0, ["ab", "c"], [1.0, -1.0]),
            _group(1, ["5", "6"], [-1.0, -1.0])]  # zero variance: filtered
  groups[0].completions[0] = _completion("ab", 0, forced=forced)
  batch, stats, keep = rollouts.build_batch(groups, rl, shape)
  np.testing.assert_array_equal(keep, [True, False])
  np.testing.assert_allclose(batch.advantages_PG, [[1, -1], [0, 0], [0, 0]])
  np.testing.assert_array_equal(batch.weight_PG, [[1, 1], [0, 0], [0, 0]])  # row 2 = padding
  np.testing.assert_array_equal(batch.prompt_id_PG[:, 0], [0, 1, -1])
  lp = len(groups[0].prompt.token_ids)
  mask = batch.loss_mask_PGS[0, 0]
  assert mask[lp] == 0 and mask[lp + 1] == 1 and mask[lp + 2] == 1  # forced token: no loss
  assert mask.sum() == 2 and batch.input_mask_PGS[0, 0].sum() == lp + 3
  np.testing.assert_allclose(batch.gen_logp_PGS[0, 0, lp:lp + 3],
                             groups[0].completions[0].logprobs)
  assert stats["rollout/pass_rate"] == pytest.approx(0.25)
  assert stats["rollout/num_kept"] == 1.0 and stats["rollout/frac_zero_variance"] == 0.5


def test_batch_normalisation_divides_by_the_std_of_kept_groups():
  rl = config.RLConfig(advantage_norm="batch")
  shape = rollouts.BatchShape(num_prompts=2, group_size=2, seq_len=12, pad_id=0)
  batch, _, _ = rollouts.build_batch([_group(0, ["1", "2"], [1.0, -1.0]),
                                      _group(1, ["1", "2"], [1.0, 1.0])], rl, shape)
  # Kept advantages are +-1 (std 1), so dividing leaves them (up to eps).
  np.testing.assert_allclose(batch.advantages_PG[0], [1.0, -1.0], rtol=1e-5)


def test_min_version_and_errors():
  g = _group(0, ["1", "22"], [1.0, -1.0], version=3)
  g.completions[1].versions[:] = [4, 5, 5]
  assert g.min_version == 3
  shape = rollouts.BatchShape(num_prompts=1, group_size=3, seq_len=12, pad_id=0)
  with pytest.raises(ValueError, match="expected 3"):
    rollouts.build_batch([g], config.RLConfig(), shape)
