"""benchmarks/peers/ whole-loop comparison (loop_task, peer_loops, loop_compare): what can
be checked without Tunix or TRL installed. The tokenizer every side loads, the prompts of
each step from our own source, the run's config, the summary and ratio arithmetic against
hand computations, bad flags in one line; slow: the checkpoint builder and our side's loop
on a tiny random checkpoint. No timing is judged (a loaded machine must pass)."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.peers import loop_compare, loop_task, peer_loops  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("loop_tok")
  loop_task.write_tokenizer(str(directory))
  return str(directory)


def spec_for(model: str, steps: int = 3, per_step: int = 4) -> dict:
  return dict(model=model, task=loop_task.TASK, group=2, cap=6, prompt_len=8,
              temperature=1.0, lr=1e-5, eps=1e-15, weight_decay=0.01, max_grad_norm=1.0,
              seed=0, prompts=[[{}] * per_step] * steps)


def test_tokenizer_is_bytes_with_eos_and_pad(tok_dir):
  from jaxrl_scale.models import tokenizer as tokenizer_lib

  tok = tokenizer_lib.load_tokenizer(tok_dir)
  assert tok.bos_id is None and tok.eos_id == loop_task.EOS_ID and tok.pad_id == loop_task.PAD_ID
  assert tok.encode("12+34=") == list(b"12+34=")
  assert tok.decode([52, 54, loop_task.EOS_ID], skip_special_tokens=True) == "46"


def test_run_config_and_prompts_per_step(tok_dir):
  from jaxrl_scale import config as config_lib

  spec = spec_for(tok_dir)
  cfg = config_lib.load(peer_loops.BASE_CONFIG, peer_loops.ours_overrides(spec))
  assert (cfg.run.steps, cfg.rl.prompts_per_step, cfg.rl.generations_per_prompt) == (3, 4, 2)
  assert cfg.sampler.max_new_tokens == 6 and cfg.sft.steps == 0 and cfg.eval.every == 0
  assert cfg.model.path == tok_dir and cfg.optim.warmup_steps == 0
  steps = loop_task.step_prompts(cfg.data, tok_dir, 3, 4)
  assert [len(b) for b in steps] == [4, 4, 4]
  flat = [p for b in steps for p in b]
  assert len({p["id"] for p in flat}) == 12  # one epoch of 12 records, each once
  for p in flat:
    a, b = p["prompt"].rstrip("=").split("+")
    assert int(a) + int(b) == int(p["answer"])
  assert steps == loop_task.step_prompts(cfg.data, tok_dir, 3, 4)  # seeded


def test_reward_is_our_verifier_plus_minus_one():
  reward = peer_loops.reward_fn()
  assert reward(["46", "45", " 46", "x"], ["46"] * 4) == [1.0, -1.0, 1.0, -1.0]


def rows(step_s, passes):
  out, end = [], 0.0
  for k, (s, p) in enumerate(zip(step_s, passes), 1):
    end += s
    out.append({"step": k, "end_s": end, "step_s": s, "reward_mean": 2 * p - 1,
                "pass_rate": p, "length_mean": 3.0,
                "phases": {"train": s / 2, "nan": float("nan")}})
  return out


def test_summary_and_ratios_by_hand():
  ours = {"rows": rows([10.0, 1.0, 3.0, 2.0], [0.1, 0.2, 0.3, 0.4]), "process_s": 20.0}
  theirs = {"rows": rows([5.0, 4.0, 6.0, 8.0], [0.1, 0.1, 0.2, 0.2]), "wall_s": 30.0}
  s = loop_compare.summarize(ours)
  assert s["median_step_s"] == 2.0 and s["first_step_s"] == 10.0
  assert s["all_steps_s"] == 16.0 and s["mean_step_s"] == pytest.approx(2.0)
  assert s["phases_median"] == {"train": 1.0}  # NaN left out
  assert s["pass_rate"] == [0.1, 0.2, 0.3, 0.4]
  vs = loop_compare.compare({"ours": [ours], "tunix": [theirs]})["ours/tunix"]
  assert vs["steps_per_s"]["median"] == pytest.approx(6.0 / 2.0)  # their 6 s, our 2 s
  assert vs["all_steps_time"]["median"] == pytest.approx(23.0 / 16.0)


def test_same_prompts_per_step():
  r = [{"group_ids": [1, 0]}, {"group_ids": [2, 4]}, {"group_ids": [5, 4]}]
  assert loop_compare.same_prompts(r, 2) == pytest.approx(2 / 3)
  assert loop_compare.same_prompts([{"step": 1}], 2) is None


def test_bad_flags_are_one_line(capsys):
  with pytest.raises(SystemExit):
    loop_compare.parse_args(["--sides", "ours,vllm"])
  assert "--sides" in capsys.readouterr().err.strip().splitlines()[-1]
  with pytest.raises(SystemExit):
    loop_compare.parse_args(["--group", "1"])


@pytest.mark.slow
def test_build_checkpoint_and_our_loop(tmp_path):
  """A tiny warm-started checkpoint (two supervised steps), then our side's loop on it for
  2 steps through `jaxrl-scale train` (peer_loops.run_ours): rows with times and rewards."""
  from jaxrl_scale import config as config_lib
  from jaxrl_scale.models import hf_io

  path = str(tmp_path / "ckpt")
  info = loop_task.build_checkpoint(
      path, log=lambda m: None, shape=dict(hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=16),
      steps=2, check_every=1, dev=8, batch=8, stop_pass_rate=2.0)
  assert info["warm_start"]["steps"] == 2
  assert json.loads((tmp_path / "ckpt" / "loop_task.json").read_text()) == info
  assert loop_task.build_checkpoint(path) == info  # there: not rebuilt
  model, _ = hf_io.load_hf_model(path)
  assert model is not None
  spec = spec_for(path, steps=2, per_step=2)
  cfg = config_lib.load(peer_loops.BASE_CONFIG, peer_loops.ours_overrides(spec))
  spec["prompts"] = loop_task.step_prompts(cfg.data, path, 2, 2)
  spec["ours_set"] = loop_compare.COLOCATED
  out = peer_loops.run_ours(spec, str(tmp_path))
  assert [r["step"] for r in out["rows"]] == [1, 2]
  assert all(r["step_s"] > 0 and -1 <= r["reward_mean"] <= 1 for r in out["rows"])
  assert loop_compare.same_prompts(out["rows"], 2) == 1.0
