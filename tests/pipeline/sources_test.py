import pytest

from jaxrl_scale.pipeline import sources

P, G = 3, 2


def test_sync_round_uses_current_weights_and_fresh_data(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=4)
  src = sources.RoundSource(sampler, sources.Admitter(prompt_source, G, seed=0), fakes.Scorer(),
                            P, rounds=1)
  for v in range(3):
    groups = src.next_groups(v)
    assert len(groups) == P
    assert all(g.min_version == v for g in groups)  # sampled with the newest policy
    src.after_step(groups, None, v + 1)
  assert sampler.posted == [1, 2, 3]
  assert src.state()["next_seq"] == 3 * P
  assert src.metrics(3)["gen/busy_s"] >= 0


def test_ppo_offpolicy_keeps_one_policy_for_k_minibatches(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=4)
  src = sources.RoundSource(sampler, sources.Admitter(prompt_source, G, seed=0), fakes.Scorer(),
                            P, rounds=2)
  versions = []
  for v in range(4):
    groups = src.next_groups(v)
    versions.append({g.min_version for g in groups})
    src.after_step(groups, None, v + 1)
  assert versions == [{0}, {0}, {2}, {2}]  # data of round r comes from policy 2r
  assert sampler.posted == [2, 4]  # weights move to the generator once per round


def test_admitter_state_restarts_at_oldest_unconsumed(prompt_source):
  adm = sources.Admitter(prompt_source, G, seed=5)
  first = [adm.admit(0) for _ in range(4)]
  adm.consumed([first[0][0]])
  state = adm.state()
  assert state["next_seq"] == 1
  again = sources.Admitter(prompt_source, G, seed=5)
  again.load_state(state)
  seq, prompt, requests = again.admit(0)
  assert seq == 1 and prompt.id == first[1][1].id
  assert [r.seed for r in requests] == [r.seed for r in first[1][2]]  # same samples
  assert [r.sample_index for r in requests] == list(range(G))


def test_admitter_refuses_a_state_that_would_train_a_group_twice(prompt_source):
  adm = sources.Admitter(prompt_source, G, seed=5)
  seqs = [adm.admit(0)[0] for _ in range(3)]
  adm.consumed([seqs[0], seqs[2]])  # group 1 skipped: a resume at 1 would retrain group 2
  with pytest.raises(RuntimeError, match="trained on before group 1"):
    adm.state()


def test_admitter_with_nothing_outstanding_returns_the_current_position(prompt_source):
  adm = sources.Admitter(prompt_source, G, seed=0)
  seqs = [adm.admit(0)[0] for _ in range(2)]
  adm.consumed(seqs)
  assert adm.state() == {"data": prompt_source.state_dict(), "next_seq": 2}
