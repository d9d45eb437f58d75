"""A training run with an environment (config `env`): rollouts, SFT dev checks and evals
run episodes through the one Sampler, and a bad environment stops the run with one line."""

import pathlib

import pytest

from jaxrl_scale import config, errors, metrics
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.pipeline import environment, wiring

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _write_task(path: pathlib.Path) -> None:
  import json  # pylint: disable=g-import-not-at-top
  with open(path, "w") as f:
    for i in range(80):
      a = str(i % 2)
      f.write(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": a, "solution": a}) + "\n")


def _cfg(tmp_path, *extra):
  data = tmp_path / "parity.jsonl"
  _write_task(data)
  return config.load(ROOT / "configs" / "cpu_tiny.yaml", [
      "run.steps=2", "run.tensorboard=false", "run.progress=false",
      "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64",
      f"data.source={data}", "data.task=arithmetic", "data.id_field=id",
      "data.solution_field=solution", "data.num_validation=8", "data.max_prompt_tokens=8",
      "sft.steps=4", "sft.lr=1e-2", "sft.batch_size=16", "run.sft_stop_pass_rate=null",
      "rl.prompts_per_step=4", "rl.generations_per_prompt=4", "optim.lr=1e-3",
      "optim.warmup_steps=0", "sampler.num_slots=16", "sampler.max_new_tokens=96",
      "sampler.decode_chunk=8", "sampler.prompt_buckets=[8]", "eval.every=2",
      "eval.samples_per_prompt=2", "checkpoint.every=0", "checkpoint.async_save=false",
      "forecast.n_boot=0", "pipeline.mode=sync", f"run.output_dir={tmp_path / 'run'}",
      *extra])


def test_a_retry_run_trains_on_episodes_and_logs_their_metrics(tmp_path):
  cfg = _cfg(tmp_path, "env.name=retry", "env.max_turns=2", "env.options=[attempts=2]")
  outcome = wiring.train(cfg, cfg.run.output_dir)
  assert outcome.reason == "done" and outcome.step == 2
  rows = metrics.read_metrics(pathlib.Path(cfg.run.output_dir) / "metrics.jsonl")
  steps = [r for r in rows if r["step"] >= 1]
  assert steps and all("rollout/turns_mean" in r for r in steps)
  # A barely trained policy is wrong on many samples: those got the feedback and a second
  # turn, whose environment tokens are a share of the rollout tokens.
  assert max(r["rollout/turns_max"] for r in steps) == 2
  assert max(r["rollout/env_token_frac"] for r in steps) > 0
  assert "val/pass_rate" in rows[-1]


def test_a_single_turn_run_has_no_episode_metrics(tmp_path):
  cfg = _cfg(tmp_path, "sft.steps=0", "run.steps=1", "eval.every=0")
  assert environment.episodes(cfg, None) is None
  wiring.train(cfg, cfg.run.output_dir)
  rows = metrics.read_metrics(pathlib.Path(cfg.run.output_dir) / "metrics.jsonl")
  assert not any("rollout/turns_mean" in r for r in rows)


def _prompt():
  return data_sources.Prompt(id="p0", task="arithmetic", prompt="1+1", text="1+1",
                             token_ids=(5, 6, 7), answer="2", solution="2")


@pytest.mark.parametrize("extra, message", [
    (["env.name=retyr"], "unknown environment 'retyr'; did you mean 'retry'"),
    (["env.name=retry", "env.options=[attemps=3]"], "environment 'retry'"),
    (["env.name=retry", "env.options=[attempts=0]"], "attempts >= 1"),
])
def test_a_bad_environment_is_one_line_naming_it(tmp_path, extra, message):
  cfg = _cfg(tmp_path, *extra)
  tok = tokenizer_lib.ByteTokenizer()
  with pytest.raises(errors.UserError, match=message) as e:
    episode_for = environment.episodes(cfg, tok)
    episode_for(_prompt())
  assert "\n" not in str(e.value)


def test_options_are_key_value_with_yaml_values(tmp_path):
  cfg = _cfg(tmp_path, "env.name=retry", "env.options=[attempts=3, discount=1.0, role=user]")
  assert environment.options(cfg.env) == {"attempts": 3, "discount": 1.0, "role": "user"}
  with pytest.raises(errors.UserError, match="env.options"):
    _cfg(tmp_path, "env.options=[attempts]")
  lim = environment.limits(cfg)
  assert lim.max_tokens == cfg.sampler.max_new_tokens and lim.max_turns == 4
  assert environment.record(_prompt())["reward"] == "arithmetic"


def test_a_python_tool_run_warm_starts_on_played_traces_and_calls_the_tool(tmp_path):
  cfg = config.load(ROOT / "configs" / "cpu_tool.yaml", [
      "run.steps=1", "run.tensorboard=false", "run.progress=false",
      "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64",
      "data.num_train=64", "data.num_validation=4", "sft.steps=2", "sft.batch_size=16",
      "run.sft_stop_pass_rate=null", "rl.prompts_per_step=2", "rl.generations_per_prompt=4",
      "sampler.num_slots=8", "eval.every=1", "eval.samples_per_prompt=1",
      "checkpoint.every=0", "checkpoint.async_save=false", "forecast.enabled=false",
      "pipeline.mode=sync", f"run.output_dir={tmp_path / 'run'}"])
  outcome = wiring.train(cfg, cfg.run.output_dir)
  assert outcome.reason == "done"
  run = pathlib.Path(cfg.run.output_dir)
  sft = metrics.read_metrics(run / "sft.jsonl")
  # One example per model turn: a trace's two turns hold ~40 target tokens, the turns
  # apart (the tool's output is context) far fewer than 16 whole 40-token solutions.
  assert len(sft) == 2 and all(0 < r["num_loss_tokens"] < 16 * 30 for r in sft)
  rows = metrics.read_metrics(run / "metrics.jsonl")
  assert any("rollout/tool_calls" in r and "rollout/turns_mean" in r for r in rows)
  assert "val/pass_rate" in rows[-1]


def test_a_run_without_its_environments_stop_string_is_one_line(tmp_path):
  cfg = config.load(ROOT / "configs" / "cpu_tool.yaml", ["sampler.stop_strings=[]"])
  with pytest.raises(errors.UserError, match="sampler.stop_strings.*'</python>'"):
    environment.episodes(cfg, None)
