"""MixedSource: proportions by weight, seeded draws, exact resume, domains and verifiers,
per-domain validation, the single-source path, and config errors."""

import json
import math

import numpy as np
import pytest

from jaxrl_scale import config
from jaxrl_scale.data import mixture
from jaxrl_scale.data import sources
from jaxrl_scale.data import tasks
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib

_BYTE = tokenizer_lib.ByteTokenizer()


def _mix(weights=(1.0, 1.0), seed=0, n=(60, 40), num_validation=(6, 4), keep=None):
  """A mixture of arithmetic ("math") and code/fn ("code") records made in memory."""
  recs = [tasks.arithmetic(n[0] + num_validation[0], 0),
          tasks.generate("code", n[1] + num_validation[1], 0)]
  domains = [mixture.Domain(name, sources.PromptSource(r, _BYTE, max_prompt_tokens=32,
                                                       num_validation=v, seed=seed), w)
             for name, r, v, w in zip(("math", "code"), recs, num_validation, weights)]
  return mixture.MixedSource(domains, seed=seed, keep=keep)


def _data_cfg(*entries, **kw):
  return config.from_dict({"data": {"max_prompt_tokens": 32, "sources": list(entries), **kw}}
                          ).data


@pytest.mark.parametrize("weights", [(1.0, 1.0), (3.0, 1.0), (1.0, 9.0)])
def test_domain_shares_follow_the_weights_within_binomial_tolerance(weights):
  n = 4000
  mix = _mix(weights)
  counts = {"math": 0, "code": 0}
  for p in mix.take(n):
    counts[p.domain] += 1
  share = weights[0] / sum(weights)
  sd = math.sqrt(n * share * (1 - share))
  assert abs(counts["math"] - n * share) < 4 * sd, (counts, share)  # 4 sd: ~6e-5 false alarm
  assert mix.shares == pytest.approx({"math": share, "code": 1 - share})


def test_three_sources_chi_square():
  recs = [tasks.arithmetic(40, s) for s in range(3)]
  mix = mixture.MixedSource(
      [mixture.Domain(f"d{i}", sources.PromptSource(r, _BYTE, max_prompt_tokens=32), w)
       for i, (r, w) in enumerate(zip(recs, (1.0, 2.0, 5.0)))], seed=7)
  n = 8000
  counts = np.zeros(3)
  for p in mix.take(n):
    counts[int(p.domain[1])] += 1
  expected = n * np.array([1, 2, 5]) / 8
  chi2 = float(((counts - expected) ** 2 / expected).sum())
  assert chi2 < 18.4, (counts, expected)  # chi-square, 2 dof: P(> 18.4) = 1e-4


def test_draws_are_seeded():
  ids = [p.id for p in _mix(seed=3).take(50)]
  assert ids == [p.id for p in _mix(seed=3).take(50)]
  assert [p.domain for p in _mix(seed=4).take(50)] != [p.domain for p in _mix(seed=3).take(50)]


def test_resume_draws_what_an_uninterrupted_stream_draws():
  """Across epochs of both sources (60 and 40 training prompts) and with a keep hook."""
  dropped = lambda pid: not pid.endswith(("3", "7"))  # noqa: E731
  straight = [p.id for p in _mix((2.0, 1.0), keep=dropped).take(300)]
  first = _mix((2.0, 1.0), keep=dropped)
  head = [p.id for p in first.take(137)]
  state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
  resumed = _mix((2.0, 1.0), keep=dropped)
  resumed.load_state_dict(state)
  assert head + [p.id for p in resumed.take(163)] == straight
  assert not any(i.endswith(("3", "7")) for i in straight)
  assert state["domains"]["math"]["epoch"] >= 1 and state["domains"]["code"]["epoch"] >= 1


def test_a_resume_without_the_draw_counter_would_differ():
  """Guards the test above: restoring only the sources' positions draws other domains."""
  first = _mix((2.0, 1.0))
  first.take(137)
  state = first.state_dict()
  after = [p.domain for p in first.take(100)]
  state["draws"] = 0
  other = _mix((2.0, 1.0))
  other.load_state_dict(state)
  assert [p.domain for p in other.take(100)] != after


def test_load_state_dict_errors():
  mix = _mix()
  with pytest.raises(UserError, match="single-source run"):
    mix.load_state_dict({"epoch": 0, "index": 0, "seed": 0, "num_train": 60})
  state = mix.state_dict()
  with pytest.raises(UserError, match=r"domains \['code', 'maths'\] differ"):
    mix.load_state_dict({**state, "domains": {"maths": state["domains"]["math"],
                                              "code": state["domains"]["code"]}})
  with pytest.raises(UserError, match="seed 5 differs"):
    mix.load_state_dict({**state, "seed": 5})
  with pytest.raises(UserError, match="'draws' is missing"):
    mix.load_state_dict({"seed": 0, "domains": state["domains"]})


def test_prompts_carry_domain_verifier_and_prefixed_ids():
  cfg = _data_cfg({"source": "arithmetic/add2", "num_train": 50, "num_validation": 5},
                  {"source": "code/fn", "num_train": 30, "num_validation": 3})
  mix = mixture.from_config(cfg, _BYTE)
  assert isinstance(mix, mixture.MixedSource) and mix.names == ["math", "code"]
  drawn = mix.take(40)
  assert {p.domain for p in drawn} == {"math", "code"}
  for p in drawn:
    assert p.task == {"math": "arithmetic", "code": "code"}[p.domain]
    assert p.id.startswith(p.domain + "/")
    assert (p.domain == "code") == p.prompt.startswith("f(x)=")
  val = mix.validation()
  assert [p.domain for p in val] == ["math"] * 5 + ["code"] * 3
  assert mix.num_train == 80 and mix.num_validation == 8
  # Each domain's held-out prompts never appear in its training stream.
  assert not {p.id for p in val} & {p.id for p in mix.take(400)}


def test_a_source_task_overrides_the_verifier_and_names_the_domain():
  cfg = _data_cfg({"source": "arithmetic", "num_train": 20, "num_validation": 2},
                  {"source": "code/easy", "task": "code_fraction", "num_train": 20,
                   "num_validation": 2})
  mix = mixture.from_config(cfg, _BYTE)
  assert mix.names == ["math", "code"]
  assert {p.task for p in mix.take(30) + mix.validation() if p.domain == "code"} == {
      "code_fraction"}


def test_the_keep_hook_sees_prefixed_ids():
  asked = []
  mix = _mix(keep=lambda pid: asked.append(pid) or True)
  got = [p.id for p in mix.take(10)]
  assert asked == got


def test_validation_subset_caps_each_domain():
  mix = _mix(num_validation=(6, 4))
  val = mix.validation()
  sub = mixture.validation_subset(val, 3)
  assert [p.domain for p in sub] == ["math"] * 3 + ["code"] * 3
  assert mixture.validation_subset(val, 0) == val


def test_single_source_path_is_unchanged():
  """No data.sources: the plain PromptSource, prompts without a domain, eval slice as before."""
  cfg = config.from_dict({"data": {"source": "arithmetic", "num_train": 40,
                                   "num_validation": 10}}).data
  src = mixture.from_config(cfg, _BYTE)
  assert type(src) is sources.PromptSource
  recs = tasks.arithmetic(50, 0, digits=2)
  drawn = src.take(45)
  assert all(p.domain == "" and p.id.startswith("arithmetic-") for p in drawn)
  assert {p.id for p in drawn[:40]} | {p.id for p in src.validation()} == {r["id"] for r in recs}
  assert src.state_dict() == {"epoch": 1, "index": 5, "seed": 0, "num_train": 40}
  val = src.validation()
  assert mixture.validation_subset(val, 4) == val[:4]


def test_one_source_mixture_is_that_source_with_a_domain():
  recs = tasks.arithmetic(30, 0)
  plain = sources.PromptSource(recs, _BYTE, max_prompt_tokens=32, num_validation=5)
  mix = mixture.MixedSource([mixture.Domain("math", sources.PromptSource(
      recs, _BYTE, max_prompt_tokens=32, num_validation=5), 1.0)])
  assert [p.id for p in mix.take(60)] == ["math/" + p.id for p in plain.take(60)]


@pytest.mark.parametrize("entries, extra, message", [
    ([{"source": "code/fn", "weight": 0}], {}, r"data.sources\[0\].weight': must be a number > 0"),
    ([{"source": "code/fn", "weight": -1}], {}, r"data.sources\[0\].weight'"),
    ([{"source": "code/fn"}, {"source": "code/easy"}], {},
     r"data.sources\[1\].name': domain 'code' is also data.sources\[0\]'s"),
    ([{"source": "arithmetic", "name": "val/x"}], {}, r"data.sources\[0\].name': 'val/x' is not"),
    ([{"source": "arithmetic", "name": "Math"}], {}, r"'Math' is not a metric-key name"),
    ([{"source": "arithmetic", "wieght": 2}], {},
     r"unknown config key 'data.sources\[0\].wieght' \(did you mean 'data.sources\[0\].weight'"),
    ([{"weight": 2}], {}, r"data.sources\[0\].source': must name"),
    ([{"source": "arithmetic", "num_validation": -1}], {}, r"data.sources\[0\].num_validation'"),
    ([{"source": "arithmetic"}], {"source": "tfds:gsm8k"},
     r"'data.source': is not used when data.sources is set"),
    ([{"source": "arithmetic"}], {"num_validation": 8}, r"'data.num_validation': is not used"),
    (["arithmetic"], {}, r"data.sources\[0\]': expected a mapping"),
])
def test_config_errors_are_one_line(entries, extra, message):
  with pytest.raises(UserError, match=message) as e:
    _data_cfg(*entries, **extra)
  assert "\n" not in str(e.value)


def test_build_errors_name_the_entry():
  with pytest.raises(UserError, match=r"data.sources\[1\].task': task 'cobol' has no reward"):
    mixture.from_config(_data_cfg({"source": "arithmetic"},
                                  {"source": "code/fn", "task": "cobol", "name": "c"}), _BYTE)
  with pytest.raises(UserError, match=r"'data.sources\[1\]': .*'sudoku' is not a built-in"):
    mixture.from_config(_data_cfg({"source": "arithmetic"}, {"source": "sudoku", "name": "s"}),
                        _BYTE)


def test_yaml_and_dotted_override_forms():
  cfg = config.load(None, ["data.sources=[{source: arithmetic, weight: 3}, "
                           "{source: code/fn, name: py}]"])
  assert [(s.domain, s.weight) for s in cfg.data.sources] == [("math", 3.0), ("py", 1.0)]
  # config.replace round-trips the tuple of sources (to_dict then from_dict).
  again = config.replace(cfg, **{"rl.loss": "grpo"})
  assert again.data.sources == cfg.data.sources


def test_admitter_checkpoint_of_a_mixture_regenerates_the_untrained_groups():
  """The pipeline's checkpoint state (position before the oldest group not trained on)
  over a mixture: a resumed Admitter admits exactly the groups that were not trained."""
  from jaxrl_scale.pipeline import sources as pipeline_sources  # pylint: disable=g-import-not-at-top

  first = pipeline_sources.Admitter(_mix((2.0, 1.0)), group_size=2, seed=0)
  admitted = [first.admit(0) for _ in range(30)]
  first.consumed([seq for seq, _, _ in admitted[:17]])
  state = json.loads(json.dumps(first.state()))
  resumed = pipeline_sources.Admitter(_mix((2.0, 1.0)), group_size=2, seed=0)
  resumed.load_state(state)
  again = [resumed.admit(0) for _ in range(13)]
  assert [(s, p.id, p.domain) for s, p, _ in again] == [
      (s, p.id, p.domain) for s, p, _ in admitted[17:]]


def test_the_sft_mixture_uses_sft_weight():
  cfg = _data_cfg({"source": "arithmetic", "num_train": 20, "num_validation": 2,
                   "sft_weight": 3.0},
                  {"source": "code/fn", "num_train": 20, "num_validation": 2},
                  {"source": "countdown", "name": "puzzles", "num_train": 20,
                   "num_validation": 2, "weight": 2.0, "sft_weight": 0})
  assert mixture.from_config(cfg, _BYTE).shares == pytest.approx(
      {"math": 0.25, "code": 0.25, "puzzles": 0.5})
  sft = mixture.from_config(cfg, _BYTE, sft=True)
  assert sft.shares == pytest.approx({"math": 0.75, "code": 0.25})  # puzzles: no SFT
  with pytest.raises(UserError, match="every sft_weight is 0"):
    mixture.from_config(_data_cfg({"source": "arithmetic", "sft_weight": 0}), _BYTE, sft=True)
  with pytest.raises(UserError, match=r"data.sources\[0\].sft_weight': must be a number >= 0"):
    _data_cfg({"source": "arithmetic", "sft_weight": -1})
