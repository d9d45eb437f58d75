import pytest

from jaxrl_scale import config
from jaxrl_scale.errors import UserError


def test_defaults_are_the_scalerl_recipe():
  cfg = config.Config()
  assert cfg.rl.loss == "cispo" and cfg.rl.eps_max == 5.0
  assert cfg.rl.aggregation == "prompt_avg" and cfg.rl.advantage_norm == "batch"
  assert cfg.optim.eps == 1e-15 and cfg.model.lm_head_fp32
  assert cfg.pipeline.mode == "pipeline" and cfg.pipeline.max_staleness == 8


def test_yaml_then_overrides(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text("rl:\n  loss: grpo\n  eps_max: 4\noptim:\n  lr: 1e-6\n")
  cfg = config.load(path, ["rl.loss=dapo", "sampler.prompt_buckets=[8, 16]", "model.path=/x"])
  assert cfg.rl.loss == "dapo"  # override beats file
  assert cfg.rl.eps_max == 4.0 and isinstance(cfg.rl.eps_max, float)
  assert cfg.optim.lr == 1e-6  # YAML reads "1e-6" as a string; still a float here
  assert cfg.sampler.prompt_buckets == (8, 16)
  assert cfg.model.path == "/x"
  assert cfg.run.steps == config.RunConfig().steps  # untouched default


@pytest.mark.parametrize("overrides, match", [
    (["rl.los=grpo"], r"unknown config key 'rl.los' \(did you mean 'rl.loss'\?\)"),
    (["rll.loss=grpo"], r"unknown config key 'rll' \(did you mean 'rl'\?\)"),
    (["run.steps=abc"], r"'run.steps': expected an integer"),
    (["run.steps=1.5"], r"'run.steps': expected an integer"),
    (["pipeline.mode=pipline"], r"'pipeline.mode'.*did you mean 'pipeline'"),
    (["model.lm_head_fp32=maybe"], r"'model.lm_head_fp32': expected true/false"),
    (["sampler.top_p=0"], r"'sampler.top_p': must be in \(0, 1\]"),
    (["optim.lr=-1"], r"'optim.lr': must be > 0"),
    (["rl.generations_per_prompt=1"], r"'rl.generations_per_prompt'"),
    (["noequals"], r"not of the form key.sub=value"),
    # Forced interruption with the defaults (budget 0) would force the phrase at token 0.
    (["sampler.interrupt=true"], r"'sampler.interrupt_min': must be > 0"),
    (["sampler.interrupt=true", "sampler.interrupt_min=4", "sampler.interrupt_max=3"],
     r"'sampler.interrupt_min': must be <= sampler.interrupt_max"),
    (["sampler.interrupt=true", "sampler.interrupt_min=4", "sampler.interrupt_max=32",
      "sampler.max_new_tokens=32"], r"'sampler.interrupt_max': must be < sampler.max_new"),
    (["sampler.interrupt=true", "sampler.interrupt_min=4", "sampler.interrupt_max=20",
      "sampler.max_new_tokens=32", "sampler.answer_budget=13"],
     r"'sampler.answer_budget': 13 does not fit"),
    (["sampler.answer_budget=-1"], r"'sampler.answer_budget': must be >= 0"),
])
def test_bad_values_are_one_line_errors_naming_the_key(overrides, match):
  with pytest.raises(UserError, match=match) as info:
    config.load(None, overrides)
  assert "\n" not in str(info.value)


def test_interrupt_settings_that_fit_are_accepted():
  cfg = config.load(None, ["sampler.interrupt=true", "sampler.interrupt_min=4",
                           "sampler.interrupt_max=20", "sampler.max_new_tokens=32",
                           "sampler.answer_budget=12"])
  assert (cfg.sampler.interrupt_min, cfg.sampler.interrupt_max) == (4, 20)
  # Off, the budgets are not used and need not fit.
  assert not config.load(None, ["sampler.interrupt_max=64"]).sampler.interrupt


def test_bad_yaml_file(tmp_path):
  missing = tmp_path / "nope.yaml"
  with pytest.raises(UserError, match="cannot read config file"):
    config.load(missing)
  bad = tmp_path / "bad.yaml"
  bad.write_text("rl: [unclosed\n")
  with pytest.raises(UserError, match=r"bad.yaml line \d+: invalid YAML"):
    config.load(bad)
  wrong = tmp_path / "wrong.yaml"
  wrong.write_text("rl:\n  nope: 1\n")
  with pytest.raises(UserError, match=r"'rl.nope'.*wrong.yaml"):
    config.load(wrong)


def test_round_trip_and_replace():
  cfg = config.load(None, ["sampler.stop_strings=['</answer>']", "optim.max_grad_norm=1.0"])
  again = config.from_dict(config.to_dict(cfg))
  assert again == cfg
  changed = config.replace(cfg, **{"rl.loss": "gspo", "run.seed": 3})
  assert changed.rl.loss == "gspo" and changed.run.seed == 3
  assert changed.sampler.stop_strings == ("</answer>",)
  with pytest.raises(Exception):
    cfg.rl.loss = "x"  # frozen
