"""`jaxrl-scale generate --env`: episodes of a named environment, printed turn by turn."""

import json

import pytest

from jaxrl_scale import cli
from jaxrl_scale.generation import engine


@pytest.fixture
def quick_turns(monkeypatch):
  """A random policy's turns end quickly: a third of the byte ids end a turn (EOS)."""
  init = engine.Sampler.__init__

  def patched(self, *a, **k):
    k["eos_ids"] = tuple(range(0, 256, 3)) + (257,)
    init(self, *a, **k)

  monkeypatch.setattr(engine.Sampler, "__init__", patched)


def test_retry_episodes_print_each_turn_and_their_reward(hf_checkpoints, capsys, quick_turns):
  ck = hf_checkpoints["qwen2"]
  argv = ["generate", "--model", ck.path, "--prompt", "2+3=", "--n", "4", "--seed", "1",
          "--max-new-tokens", "96", "--env", "retry", "--answer", "5", "--max-turns", "2",
          "--env-option", "feedback=Try again."]
  assert cli.main(argv + ["--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  multi = [c for c in out["completions"] if any(t["role"] == "env" for t in c["turns"])]
  assert multi, "no sample got the environment's feedback"
  for c in multi:
    roles = [t["role"] for t in c["turns"]]
    assert roles[:3] == ["model", "env", "model"] and "Try again." in c["turns"][1]["text"]
    env_tokens = sum(c["env_mask"])
    assert 0 < env_tokens < c["num_tokens"] and len(c["env_mask"]) == c["num_tokens"]
    # The random policy is wrong on both attempts (the reward of a wrong last attempt),
    # unless it ran out of tokens (no reward: the task's verifier then scores it).
    assert c["reward"] in (-1.0, None)
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert "[model]" in text and "[env]" in text and "[end] 2 turn(s)" in text


def test_an_unknown_environment_or_option_is_one_line(hf_checkpoints, capsys):
  ck = hf_checkpoints["qwen2"]
  base = ["generate", "--model", ck.path, "--prompt", "x", "--max-new-tokens", "8"]
  assert cli.main(base + ["--env", "retyr"]) == 2
  err = capsys.readouterr().err.strip()
  assert "did you mean 'retry'" in err and len(err.splitlines()) == 1
  assert cli.main(base + ["--env", "retry", "--env-option", "attempts"]) == 2
  err = capsys.readouterr().err.strip()
  assert "--env-option: entries are key=value" in err and len(err.splitlines()) == 1


def test_an_environment_brings_its_stop_strings(hf_checkpoints, capsys, monkeypatch):
  """python_tool's turn ends at "</python>": `generate --env` adds it to --stop's."""
  init, seen = engine.Sampler.__init__, []

  def patched(self, model, cfg, **k):
    seen.append(cfg.stop_strings)
    init(self, model, cfg, **k)

  monkeypatch.setattr(engine.Sampler, "__init__", patched)
  ck = hf_checkpoints["qwen2"]
  base = ["generate", "--model", ck.path, "--prompt", "x", "--max-new-tokens", "4"]
  assert cli.main(base + ["--stop", "###"]) == 0
  assert cli.main(base + ["--env", "python_tool", "--stop", "###"]) == 0
  capsys.readouterr()
  assert seen == [("###",), ("###", "</python>")]
