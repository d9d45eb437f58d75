import dataclasses
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale import config
from jaxrl_scale import rewards
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.data import tasks
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.rl import losses

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


def test_truncated_completion_earns_nothing_from_the_last_number():
  # Cut by max_new_tokens (no EOS), no <think> tag: the trailing "12" is mid-reasoning.
  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=2)
  try:
    group = scorer.group(0, _prompt(0, answer="12"),
                         [_completion("5+7=12", 0, eos=False), _completion("5+7=12", 1),
                          _completion(r"\boxed{12} check: 5+", 2, eos=False)], 0)
  finally:
    scorer.close()
  np.testing.assert_array_equal(group.rewards_G, [-1.0, 1.0, 1.0])
  np.testing.assert_array_equal(group.correct_G, [False, True, True])


def test_verifier_errors_and_timeouts_make_samples_invalid_not_wrong():
  release = threading.Event()

  def verifier(response, answer):
    if response == "hang":
      release.wait(60)
    if response == "boom":
      raise RuntimeError("verifier bug")
    return response == answer

  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=2, timeout_s=0.5)
  scorer._scorers["arithmetic"] = rewards.Scorer(verifier, timeout_s=0.5, num_threads=2)
  try:
    group = scorer.group(0, _prompt(0, answer="7"),
                         [_completion(t, j) for j, t in enumerate(["7", "hang", "boom", "8"])],
                         0)
  finally:
    release.set()
    scorer.close()
  np.testing.assert_array_equal(group.valid_G, [True, False, False, True])
  assert group.rewards_G[0] == 1.0 and group.rewards_G[3] == -1.0
  assert np.isnan(group.rewards_G[1:3]).all()
  assert group.counts["timeouts"] == 1 and group.counts["errors"] == 1


def test_repeated_completions_are_verified_once_and_all_counted():
  # A converging policy repeats itself: each distinct (text, truncated) of a group costs one
  # verifier call (for code, a sandboxed process); every completion gets its verdict.
  calls = []
  lock = threading.Lock()

  def verifier(response, answer):
    with lock:
      calls.append(response)
    if response == "boom":
      raise RuntimeError("verifier bug")
    return response == answer

  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=2)
  scorer._scorers["arithmetic"] = rewards.Scorer(verifier, num_threads=2)
  texts = ["7", "7", "8", "boom", "7", "boom", "8", "7"]
  try:
    group = scorer.group(0, _prompt(0, answer="7"),
                         [_completion(t, j) for j, t in enumerate(texts)]
                         + [_completion("7", len(texts), eos=False)], 0)
  finally:
    scorer.close()
  assert sorted(calls) == ["7", "7", "8", "boom"]  # the cut "7" is a distinct call
  np.testing.assert_array_equal(group.correct_G, [1, 1, 0, 0, 1, 0, 0, 1, 1])
  np.testing.assert_array_equal(group.valid_G, [1, 1, 1, 0, 1, 0, 1, 1, 1])
  assert group.counts["total"] == 9 and group.counts["correct"] == 5
  assert group.counts["wrong"] == 2 and group.counts["errors"] == 2


def test_build_batch_leaves_invalid_samples_out_of_the_advantages_and_counts_them():
  rl = config.RLConfig(advantage_norm="none", zero_variance_filter=True)
  shape = rollouts.BatchShape(num_prompts=4, group_size=4, seq_len=12, pad_id=TOK.PAD)
  nan = np.nan
  groups = [_group(0, list("abcd"), [1, -1, -1, nan]),     # mean of the 3 valid: -1/3
            _group(1, list("abcd"), [nan, 1, 1, -1]),
            _group(2, list("abcd"), [nan, nan, nan, 1])]  # 1 valid sample: dropped
  groups[0].counts.update(timeouts=1, errors=0)
  groups[1].counts.update(timeouts=0, errors=1)
  groups[2].counts.update(timeouts=2, errors=1)
  batch, stats, keep = rollouts.build_batch(groups, rl, shape)
  np.testing.assert_array_equal(keep, [True, True, False])
  np.testing.assert_allclose(batch.advantages_PG[:3], [[4 / 3, -2 / 3, -2 / 3, 0],
                                                       [0, 2 / 3, 2 / 3, -4 / 3],
                                                       [0, 0, 0, 0]], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(batch.weight_PG[:3], [[1, 1, 1, 0], [0, 1, 1, 1], [0] * 4])
  assert np.all(np.isfinite(batch.advantages_PG))
  assert stats["rewards/invalid"] == 5
  assert stats["rewards/timeouts"] == 3 and stats["rewards/errors"] == 2
  assert stats["batch/dropped_invalid_groups"] == 1
  assert stats["rollout/pass_rate"] == pytest.approx(4 / 7)  # of the 7 judged samples


def _nonfinite_groups():
  groups = [_group(i, ["1", "22", "3"], [1.0, -1.0, -1.0]) for i in range(3)]
  groups[1].completions[1].logprobs[1] = -np.inf
  groups[2].completions[0].logprobs[0] = np.nan
  return groups


def test_a_nonfinite_behaviour_logprob_drops_only_its_group():
  rl = config.RLConfig(advantage_norm="batch")
  shape = rollouts.BatchShape(num_prompts=4, group_size=3, seq_len=12, pad_id=TOK.PAD)
  groups = _nonfinite_groups()
  clean = [_group(0, ["1", "22", "3"], [1.0, -1.0, -1.0])]
  # A forced token's log-prob takes no part in the loss: it does not drop its group.
  forced = [True, False, False]
  groups[0].completions[1] = _completion("22", 1, forced=forced)
  groups[0].completions[1].logprobs[0] = -np.inf
  batch, stats, keep = rollouts.build_batch(groups, rl, shape)
  want, _, _ = rollouts.build_batch(clean, rl, shape)
  np.testing.assert_array_equal(keep, [True, False, False])
  np.testing.assert_array_equal(batch.weight_PG[:3], [[1, 1, 1], [0] * 3, [0] * 3])
  np.testing.assert_allclose(batch.advantages_PG, want.advantages_PG, rtol=1e-6)
  assert stats["batch/dropped_nonfinite_groups"] == 2
  assert np.all(np.isfinite(batch.gen_logp_PGS))
  # The step's loss stays finite and the kept group still gets its gradient.
  logp_PGS = jnp.asarray(batch.gen_logp_PGS) - 0.1
  fn = losses.make_policy_loss("cispo", aggregation="prompt_avg")
  (value, _), grad = jax.value_and_grad(
      lambda x: fn(x, jax.tree.map(jnp.asarray, batch.loss_batch())), has_aux=True)(logp_PGS)
  assert np.isfinite(float(value))
  grad = np.asarray(grad)
  assert np.all(grad[0].sum(-1)[batch.loss_mask_PGS[0].sum(-1) > 0] != 0)
  assert np.all(grad[1:] == 0)


# ---- mixed domains (data.sources) ----------------------------------------------------------


def _domain_group(seq, domain, rewards):
  group = _group(seq, ["1"] * len(rewards), rewards)
  group.prompt = dataclasses.replace(group.prompt, domain=domain)
  return group


def test_each_prompt_is_scored_by_its_own_domains_verifier():
  """A math answer scores under the math prompt's verifier and is no code under the code
  prompt's; the program scores under the code prompt's (run in the sandbox) and is wrong
  under the math one's."""
  (rec,) = tasks.generate("code", 1, 0)
  code_answer = rec["solution"]  # ```\nf=lambda x:...\n```
  math_prompt = dataclasses.replace(_prompt(1, answer="46"), domain="math")
  code_prompt = data_sources.Prompt(id="code/c0", task="code", prompt=rec["prompt"],
                                    text=rec["prompt"], token_ids=(1, 2), answer=rec["answer"],
                                    solution=code_answer, domain="code")
  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=2, timeout_s=30.0)
  try:
    comps = [_completion("46", 0), _completion(code_answer, 1)]
    math_group = scorer.group(0, math_prompt, comps, 0)
    code_group = scorer.group(1, code_prompt, comps, 0)
  finally:
    scorer.close()
  np.testing.assert_array_equal(math_group.rewards_G, [1.0, -1.0])
  np.testing.assert_array_equal(code_group.rewards_G, [-1.0, 1.0])
  assert code_group.counts["no_answer"] == 1  # "46" has no code block


def test_per_domain_rollout_metrics_equal_hand_computed_values():
  rl = config.RLConfig(advantage_norm="none")
  shape = rollouts.BatchShape(num_prompts=4, group_size=4, seq_len=8, pad_id=TOK.PAD)
  groups = [_domain_group(0, "math", [1.0, -1.0, -1.0, 1.0]),
            _domain_group(1, "code", [1.0, np.nan, -1.0, -1.0]),  # one sample not judged
            _domain_group(2, "math", [1.0, 1.0, 1.0, -1.0])]
  _, stats, _ = rollouts.build_batch(groups, rl, shape, domains=["math", "code", "idle"])
  assert stats["rollout/math/pass_rate"] == pytest.approx(5 / 8)
  assert stats["rollout/code/pass_rate"] == pytest.approx(1 / 3)
  assert stats["rollout/pass_rate"] == pytest.approx(6 / 11)  # overall: every judged sample
  assert (stats["rollout/math/num_groups"], stats["rollout/code/num_groups"]) == (2.0, 1.0)
  # A domain of the run with no group in this batch still has its keys.
  assert stats["rollout/idle/num_groups"] == 0.0 and np.isnan(stats["rollout/idle/pass_rate"])


def test_single_source_batches_have_no_domain_metrics():
  rl = config.RLConfig(advantage_norm="none")
  shape = rollouts.BatchShape(num_prompts=2, group_size=2, seq_len=8, pad_id=TOK.PAD)
  _, stats, _ = rollouts.build_batch([_group(0, ["1", "2"], [1.0, -1.0])], rl, shape)
  assert not [k for k in stats if k.count("/") > 1]
