"""benchmarks/gpu/gpu_suite.py --suite loop (benchmarks/gpu/loop_suite.py) on CPU: issue 62's
device runs as planned, their reports read back and set against the issue's targets, and
(slow) every run at tiny shapes (the measurements need a GPU)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
from benchmarks.gpu import gpu_suite  # noqa: E402



def test_the_loop_suite_plans_issue_62s_runs_in_order():
  """The 0.6B loop (efficiency, weight update) first, the 1.7B loop (10 steps, memory
  against the plan), then gpu_small's two seeds, each command as docs/gpu.md gives it."""
  runs = gpu_suite.plan(None, "/tmp/ck", suite="loop")
  assert [r["name"] for r in runs] == ["loop_0p6b_colocated", "loop_1p7b_colocated",
                                      "gpu_small_seed0", "gpu_small_seed1"]
  small, big = runs[0]["argv"], runs[1]["argv"]
  assert small[0] == "benchmarks/train/rl_loop_bench.py"
  assert small[1].endswith("configs/scalerl_qwen3_0p6b_h100.yaml")
  for argv in (small, big):
    assert {"model.path=null", "data.max_prompt_tokens=128",
            "sampler.prompt_buckets=[128]"} <= set(argv)
    assert argv[argv.index("--modes") + 1] == "colocated" and argv[-1] == "--json"
  assert "sampler.kv_cache_tokens=0" in small and "--no-alone" not in small
  assert big[1].endswith("configs/scalerl_qwen3_1p7b_h100.yaml") and "--no-alone" in big
  assert big[big.index("--steps") + 1] == "10"  # the issue's "runs 10 steps"
  assert runs[0]["env"] == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
  # The plan the peaks are set against: docs/gpu.md quotes 42.0 GiB as each run's largest
  # program (0.6B prefill, 1.7B train step) from the committed plans file.
  for run in runs[:2]:
    assert run["predicted"]["peak_gib"] == pytest.approx(42.0, abs=0.1)
  assert runs[2]["argv"][:3] == ["-m", "jaxrl_scale.cli", "train"]
  assert runs[2]["argv"][3].endswith("configs/gpu_small.yaml")
  assert "run.seed=0" in runs[2]["argv"] and "run.seed=1" in runs[3]["argv"]
  assert runs[2]["out_dir"] != runs[3]["out_dir"]
  assert gpu_suite.parse_args(["--suite", "loop", "--only", "gpu_small_seed1"]).only == [
      "gpu_small_seed1"]
  with pytest.raises(SystemExit):  # issue 34's runs are not in this suite
    gpu_suite.parse_args(["--suite", "loop", "--only", "decode_b64"])


def _loop_report(step_s, generate_s, train_s, update_s, alone_gen, alone_train, peak_gib):
  med = dict(step_s=step_s, generate_s=generate_s, train_s=train_s, update_s=update_s,
             generated_tok_s_per_device=1000.0, trained_tok_s_per_device=2000.0)
  mode = dict(steps=[{}] * 6, median=med, alone=dict(generate_s=alone_gen, train_s=alone_train),
              loop_efficiency=(alone_gen + alone_train) / step_s,
              update_share_of_step=update_s / step_s,
              peak_bytes_after={"generate": 10 * 2**30, "train": peak_gib * 2**30})
  return dict(warmup=2, modes={"colocated": mode})


def test_the_loop_summary_sets_the_run_against_its_targets_and_plan():
  fine = dict(name="loop_0p6b_colocated", bench="rl_loop_bench", rc=0, seconds=200.0,
              predicted={"peak_gib": 40.0},
              report=_loop_report(10.0, 7.0, 2.9, 0.1, 6.5, 2.8, 44.0))
  poor = dict(name="loop_1p7b_colocated", bench="rl_loop_bench", rc=0, seconds=300.0,
              predicted={"peak_gib": 40.0},
              report=_loop_report(10.0, 7.0, 2.5, 0.5, 5.0, 2.5, 50.0))
  killed = dict(name="gpu_small_seed1", bench="gpu_small", rc=124, seconds=480.0,
                report=None)
  out = gpu_suite.summary([fine, poor, killed])
  a, b = out["loop_0p6b_colocated"], out["loop_1p7b_colocated"]
  assert a["loop_efficiency"] == pytest.approx(0.93) and a["steps_timed"] == 4
  assert a["peak_gib"] == 44.0 and a["peak_over_plan"] == pytest.approx(1.1)
  assert all(a["targets"].values()), a["targets"]
  # 0.75 efficiency, 5% of a step in the update, a peak 25% over the plan: all missed.
  assert b["loop_efficiency"] == pytest.approx(0.75) and b["peak_over_plan"] == 1.25
  assert not any(b["targets"].values()) and len(b["targets"]) == 3
  assert out["gpu_small_seed1"] == {"rc": 124, "seconds": 480.0}


def test_a_gpu_small_run_is_read_from_its_summary(tmp_path):
  import json
  (tmp_path / "summary.json").write_text(json.dumps(dict(
      start_pass_rate=0.31, final_pass_rate=0.62, rl_wall_s=190.0, steps=200, other=1)))
  report = gpu_suite.read_rl_summary(str(tmp_path))
  assert report == dict(start_pass_rate=0.31, final_pass_rate=0.62, rl_wall_s=190.0,
                        steps=200)
  got = gpu_suite.summary([dict(name="gpu_small_seed0", bench="gpu_small", rc=0,
                                seconds=341.0, report=report)])["gpu_small_seed0"]
  assert got["gain"] == pytest.approx(0.31) and all(got["targets"].values())
  slow = gpu_suite.summary([dict(name="gpu_small_seed0", bench="gpu_small", rc=0,
                                 seconds=400.0, report=dict(report, final_pass_rate=0.5))])
  assert not any(slow["gpu_small_seed0"]["targets"].values())
  assert gpu_suite.read_rl_summary(str(tmp_path / "missing")) is None


@pytest.mark.slow
def test_the_loop_suite_runs_on_cpu(tmp_path):
  """Every run of `--suite loop` at tiny shapes on CPU (the loop bench on the CPU demo's
  config, gpu_small shrunk): none crashes, each is read back, and --out holds the three
  files the suite writes for it (about 3 minutes on 2 cores)."""
  import json

  subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "gpu_suite.py"),
                  "--suite", "loop", "--cpu-smoke", "--out", str(tmp_path)],
                 capture_output=True, text=True, timeout=1500, check=True)
  suite = json.loads((tmp_path / "gpu_suite.json").read_text())
  assert suite["suite"] == "loop" and len(suite["runs"]) == len(gpu_suite.LOOP_RUNS)
  assert all(r["rc"] == 0 and r["report"] for r in suite["runs"])
  assert sorted(os.listdir(tmp_path)) == ["gpu_suite.json", "gpu_suite.log",
                                          "rl_loop_bench.json"]
  summary = suite["summary"]
  assert summary["loop_0p6b_colocated"]["loop_efficiency"] > 0
  assert "loop_efficiency" not in summary["loop_1p7b_colocated"]  # --no-alone
  assert summary["loop_1p7b_colocated"]["step_s"] > 0
  for seed in (0, 1):
    assert "gain" in summary[f"gpu_small_seed{seed}"]


def test_a_loop_run_killed_at_its_limit_keeps_the_steps_it_finished():
  """The 1.7B loop's target is 10 steps without running out of memory: a run killed at its
  time limit still says how many steps it finished (rl_loop_bench's own step lines)."""
  text = ("rl_loop_bench: configs/x.yaml | cuda\n"
          "  colocated step 0: 61.204 s | generate 40.1, score 0.2, train 20.3\n"
          "  colocated step 1: 24.870 s | generate 14.2, score 0.2, train 10.1\n"
          "  colocated step 2: 25.010 s | generate 14.3, score 0.2, train 10.2\n")
  got = gpu_suite.parse_loop(text)
  assert got == {"partial": True, "steps_done": 3, "step_s": [61.204, 24.87, 25.01]}
  oom = gpu_suite.parse_loop(text + "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: "
                             "Out of memory while trying to allocate 2.1GiB\n")
  assert oom["out_of_memory"] is True and oom["steps_done"] == 3
  assert gpu_suite.parse_loop("Traceback: ImportError\n") == {}
  out = gpu_suite.summary([dict(name="loop_1p7b_colocated", bench="rl_loop_bench", rc=124,
                                seconds=420.0, report=oom)])
  assert out["loop_1p7b_colocated"] == {"rc": 124, "seconds": 420.0, "steps_done": 3,
                                        "step_s": [61.204, 24.87, 25.01], "out_of_memory": True}
