"""benchmarks/train/rl_loop_bench.py on the CPU demo's config, shrunk: it runs `jaxrl-scale train`'s
loop in both modes, times every phase, and sets the loop beside its programs alone (no
timing asserted)."""

import json
import pathlib
import sys

import jax
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # benchmarks.* by name
from benchmarks.train import rl_loop_bench  # noqa: E402

SHRUNK = ["rl.prompts_per_step=4", "rl.generations_per_prompt=4", "sampler.num_slots=16",
          "model.num_layers=2"]


def test_coin_is_earned_both_ways_and_ignores_the_answer():
  texts = [f"response {i}" for i in range(64)]
  verdicts = [rl_loop_bench.coin(t, "0") for t in texts]
  assert 16 < sum(verdicts) < 48
  assert all(rl_loop_bench.coin(t, "0") == rl_loop_bench.coin(t, "1") for t in texts)


class _H100Stand_in:
  """The trainer's device as the bench reads it on a GPU (its kind, memory counters), so the
  MFU, roofline and memory paths run on CPU; the numbers mean nothing here."""

  platform = "gpu"
  device_kind = "NVIDIA H100 80GB HBM3"

  def __init__(self):
    self.peak = 0

  def memory_stats(self):
    self.peak += 1
    return {"bytes_in_use": 1, "peak_bytes_in_use": self.peak}


# Slow-only (33 s on 2 cores): the GPU bench's machinery; the loop itself is tests/train_test.py's.
@pytest.mark.slow
def test_the_bench_runs_the_loop_in_both_modes(capsys, monkeypatch):
  init = rl_loop_bench.Probe.__init__

  def on_a_gpu(self, loop, sync):
    init(self, loop, sync)
    self.device = _H100Stand_in()

  monkeypatch.setattr(rl_loop_bench.Probe, "__init__", on_a_gpu)
  rates = rl_loop_bench.rates

  def rates_on_a_gpu(*args):  # sampler_bench's roofline asks JAX for the device itself
    with monkeypatch.context() as m:
      m.setattr(jax, "devices", lambda *_: [_H100Stand_in()])
      return rates(*args)

  monkeypatch.setattr(rl_loop_bench, "rates", rates_on_a_gpu)
  assert rl_loop_bench.main([*SHRUNK, "--steps", "3", "--warmup", "1", "--repeats", "1",
                             "--modes", "sync,pipeline", "--json"]) == 0
  report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert report["platform"] == "cpu" and report["prompts"] == 4 and report["samples"] == 4
  sync, pipe = report["modes"]["sync"], report["modes"]["pipeline"]
  for mode in (sync, pipe):
    assert len(mode["steps"]) == 3 and mode["devices"] == 8
    med = mode["median"]
    assert med["train_s"] > 0 and med["update_s"] > 0 and med["step_s"] > 0
    assert med["trained_tokens"] > 0 and med["generated_tok_s_per_device"] > 0
    assert 0.0 < med["pass_rate"] < 1.0  # the coin: groups with both rewards train
    assert mode["loop_efficiency"] > 0
  # Sync: generate and score are timed inside the trainer's wait.
  assert sync["median"]["generate_s"] > 0 and sync["median"]["score_s"] > 0
  assert sync["median"]["generate_s"] <= sync["median"]["wait_s"]
  assert set(sync["alone"]) == {"update_s", "generate_s", "train_s"}
  assert "alone" not in pipe
  # On a GPU: the train phase's MFU in both modes, generate's roofline share in sync (where
  # its decode steps are counted), the device's peak after each phase.
  assert sync["median"]["decode_steps"] > 0 and "decode_steps" not in pipe["median"]
  assert sync["train_mfu"] > 0 and pipe["train_mfu"] > 0
  # A CPU's decode against an H100's bandwidth: 1e-5 or so, which sampler_bench rounds to 4
  # places (0.0 under load); that the GPU path ran and gave a share is what is checked.
  assert 0.0 <= sync["generate_fraction_of_roofline"] < 1.0
  assert "generate_fraction_of_roofline" not in pipe
  assert {"generate", "score", "train", "update"} <= set(sync["peak_bytes_after"])


@pytest.mark.parametrize("argv, words", [
    (["--steps", "2", "--warmup", "1"], "--steps 2 must exceed"),
    (["--modes", "sync,async"], "'async' is not sync"),
])
def test_bad_arguments_stop_with_one_line(argv, words, capsys):
  with pytest.raises(SystemExit) as e:
    rl_loop_bench.parse_args(argv)
  assert e.value.code == 2
  assert words in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_bad_override_stops_with_one_line(capsys):
  assert rl_loop_bench.main(["rl.loss=nope", "--steps", "3", "--warmup", "1"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("rl_loop_bench: error:") and "rl.loss" in err[0]


# Slow-only (about 20 s on 2 cores).
@pytest.mark.slow
def test_a_run_where_no_step_trains_stops_with_one_line(capsys, monkeypatch):
  # Every completion earns the same reward (as a random policy whose text the tokenizer
  # cannot decode does: all empty): the loop skips every update, and the bench says so in
  # one line instead of timing a train phase that never ran (it crashed on the programs
  # alone before).
  from jaxrl_scale.rewards import registry

  rl_loop_bench.register_coin()
  monkeypatch.setitem(registry._REWARDS, rl_loop_bench.COIN, lambda response, answer: True)  # pylint: disable=protected-access
  assert rl_loop_bench.main([*SHRUNK, "--steps", "3", "--warmup", "1", "--repeats", "1",
                             "--modes", "sync"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("rl_loop_bench: error: sync: no timed step trained"), err[-1]
  assert "sampler.max_new_tokens" in err[-1]
