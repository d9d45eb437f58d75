"""The sampler benchmarks run end to end at small shapes and print what they promise."""

import json
import os
import re
import subprocess
import sys
import time

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
SAMPLER = os.path.join(ROOT, "benchmarks", "sampler")
from benchmarks.sampler import hf_baseline  # noqa: E402
from benchmarks.sampler import sampler_bench  # noqa: E402

from jaxrl_scale.models import config as model_config  # noqa: E402


def _json(script, *args):
  out = subprocess.run([sys.executable, os.path.join(SAMPLER, script), *args],
                       capture_output=True, text=True, timeout=600, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tied,dtype", [(False, "float32"), (True, "float32"),
                                        (False, "bfloat16")])
def test_matmul_floor_runs_every_weight_matmul_of_a_decode_step(tied, dtype):
  """The floor's FLOPs per step are the model's matmul FLOPs at this batch: dropping a
  projection or the LM head (or XLA dead-coding one) would make it a false bound."""
  cfg = model_config.ModelConfig(family="llama", vocab_size=96, hidden_size=32, num_layers=2,
                                 num_heads=4, num_kv_heads=2, head_dim=8,
                                 intermediate_size=64, tie_embeddings=tied)
  batch = 4
  run, args = sampler_bench.floor_program(cfg, batch, dtype, steps=3)
  flops = run.lower(*args).compile().cost_analysis()["flops"]  # the loop body, counted once
  d, f = cfg.hidden_size, cfg.intermediate_size
  nh, kh = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  per_layer = d * nh + 2 * d * kh + nh * d + 3 * d * f
  matmul_flops = 2 * batch * (cfg.num_layers * per_layer + cfg.vocab_size * d)
  # Above it only by the elementwise work between them (more with bfloat16 converts).
  assert matmul_flops <= flops <= 1.25 * matmul_flops
  assert all(w.dtype == dtype for w in jax.tree.leaves(args))  # the model's dtype throughout
  assert sampler_bench.matmul_floor(cfg, batch, dtype, steps=3, repeats=1) > 0
  # With prompts (benchmarks/peers' whole call): their rows through every projection and
  # one row per prompt through the LM head, before the loop.
  prompt_len = 5
  run, args = sampler_bench.floor_program(cfg, batch, dtype, steps=3, prompt_len=prompt_len)
  with_prompts = run.lower(*args).compile().cost_analysis()["flops"]
  prompt_flops = 2 * batch * (prompt_len * cfg.num_layers * per_layer + cfg.vocab_size * d)
  assert matmul_flops + prompt_flops <= with_prompts <= 1.25 * (matmul_flops + prompt_flops)
  assert run(*args).shape == (batch, d)


@pytest.mark.slow  # spawns torch; the engine tests check greedy parity in the default run
def test_sampler_bench_quick_matches_transformers_greedy():
  r = _json("sampler_bench.py", "--quick", "--skip-mixed", "--repeats", "1", "--json")
  assert r["greedy_match"] == 1.0  # same checkpoint, same tokens as transformers generate
  for key in ("ours_tok_s", "hf_tok_s", "ratio", "compute_limit_tok_s", "fraction_of_limit",
              "matmul_floor_tok_s", "fraction_of_floor", "floor_over_hf"):
    assert r[key] > 0


@pytest.mark.slow  # two sampler runs in subprocesses; the engine tests cover sharing and pools
def test_kv_bench_quick_shares_the_prefill_and_bounds_the_pool():
  # A pool as large as the dense cache: everything is admitted at once.
  r = _json("kv_bench.py", "--quick", "--json", "--pool-fraction", "1")
  # 8 distinct prompts x 4 samples: one prefill row per prompt, four rows unshared.
  assert r["prefill_tokens"] * 4 == r["unshared_prefill_tokens"]
  assert r["preemptions"] == 0
  assert 0 < r["kv_bytes_live_peak"] <= r["kv_bytes_peak_used"] <= r["kv_bytes_held"]
  # A quarter-size pool: held memory follows the setting; the run still completes (the
  # bench asserts every completion reached its budget).
  r = _json("kv_bench.py", "--quick", "--json", "--pool-fraction", "0.25")
  assert r["kv_held_over_dense"] <= 0.26


@pytest.mark.slow  # two samplers in a subprocess; the engine tests check chunked prefill
def test_prefill_bench_quick_chunks_the_prefill_and_keeps_the_tokens():
  r = _json("prefill_bench.py", "--quick", "--json")
  assert r["same_tokens"] is True
  assert r["chunked_mixed_chunks"] > 0  # decode chunks ran between a prompt's pieces
  for key in ("whole_tok_s", "chunked_tok_s", "whole_max_gap_ms", "chunked_max_gap_ms",
              "stall_ratio", "throughput_ratio"):
    assert r[key] > 0


def test_transformers_runs_where_jax_runs_unless_told():
  """On a GPU the ratio is ours against transformers on that same GPU (the issue's
  comparison), not against torch on the host's CPU."""
  assert hf_baseline.device_for("auto", "gpu") == "cuda"
  assert hf_baseline.device_for("auto", "cpu") == "cpu"
  assert hf_baseline.device_for("auto", "tpu") == "cpu"  # torch has no TPU
  assert hf_baseline.device_for("cpu", "gpu") == "cpu"
  assert hf_baseline.device_for("cuda", "cpu") == "cuda"


@pytest.mark.slow  # 16 s (writes and loads a checkpoint, spawns torch); the choice is above
def test_transformers_on_a_gpu_torch_cannot_see_fails_in_one_line():
  """--hf-device cuda where torch has no CUDA device: one line naming the way out, exit 2,
  and before our own compile (no time spent on a comparison that cannot run)."""
  out = subprocess.run([sys.executable, os.path.join(SAMPLER, "sampler_bench.py"),
                        "--quick", "--skip-mixed", "--skip-floor", "--repeats", "1",
                        "--hf-device", "cuda", "--json"],
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 2, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("sampler_bench: --hf-device cuda: torch ") and "--skip-hf" in last
  assert "Traceback" not in out.stderr and "[decode]" not in out.stderr
  assert out.stdout.strip() == ""


def test_triton_config_sets_what_the_decode_traces(monkeypatch):
  """--triton-config sets `paged_triton`'s block constants (read when the decode is traced:
  the GPU suite's tuned run goes through them); a part left out keeps its constant; a bad
  part is named."""
  from jaxrl_scale.models import paged_triton

  for name in ("KV_TOKENS_PER_BLOCK", "NUM_WARPS", "NUM_STAGES", "TARGET_PROGRAMS"):
    monkeypatch.setattr(paged_triton, name, getattr(paged_triton, name))
  config = sampler_bench.triton_config("kv_tokens_per_block=32,num_warps=8,num_stages=2,"
                                       "target_programs=4096")
  got = sampler_bench.set_triton(config)
  assert got == dict(kv_tokens_per_block=32, num_warps=8, num_stages=2, target_programs=4096)
  assert (paged_triton.KV_TOKENS_PER_BLOCK, paged_triton.NUM_WARPS, paged_triton.NUM_STAGES,
          paged_triton.TARGET_PROGRAMS) == (32, 8, 2, 4096)
  assert sampler_bench.set_triton(dict(num_warps=4)) == dict(got, num_warps=4)
  assert sampler_bench.set_triton({}) == dict(got, num_warps=4)
  for bad, why in (("warps=8", "not KEY=N"), ("num_warps=eight", "not an integer"),
                   ("num_stages=0", ">= 1"), ("joint_kv=1", "not KEY=N")):
    with pytest.raises(ValueError, match=why):
      sampler_bench.triton_config(bad)
  assert sampler_bench.triton_config(None) == {}


@pytest.mark.slow  # 15 s on 2 cores: a benchmark's error path
def test_a_transformers_failure_is_reported_and_our_decode_still_measured(tmp_path, monkeypatch,
                                                                         capsys):
  """The transformers side failing (on a GPU: out of memory beside JAX) costs the comparison,
  not the run: the real worker's error comes back as HFFailed with its one-line cause and
  the worker ends; main then reports `hf_error` and its own tok/s, exit 0 (a device run
  keeps the number it is for)."""
  import argparse

  import numpy as np

  args = argparse.Namespace(vocab=64, hidden=32, intermediate=64, layers=1, heads=4,
                            kv_heads=2)
  sampler_bench._write_checkpoint(args, str(tmp_path / "ck"))
  hf = hf_baseline.HF(str(tmp_path / "ck"), "float32", "cpu")
  seconds, tokens = hf.generate(np.ones((2, 3), np.int64), 2, 1, 0.0)
  assert tokens.shape == (2, 2) and seconds > 0
  with pytest.raises(hf_baseline.HFFailed, match="^IndexError: "):
    hf.generate(np.full((2, 3), 1000, np.int64), 2, 1, 0.0)  # ids past the vocabulary
  assert not hf.proc.is_alive()
  hf.close()  # nothing left to stop: returns

  class Failing:
    def __init__(self, path, dtype, device):
      self.device, self.default_threads = device, 1

    def generate(self, *a):
      raise hf_baseline.HFFailed("OutOfMemoryError: CUDA out of memory")

  monkeypatch.setattr(hf_baseline, "HF", Failing)
  monkeypatch.setattr(sys, "argv", ["sampler_bench.py", "--quick", "--skip-mixed",
                                    "--skip-floor", "--repeats", "1", "--json"])
  start = time.perf_counter()
  assert sampler_bench.main() == 0
  wall = time.perf_counter() - start
  out = capsys.readouterr()
  report = json.loads(out.out.strip().splitlines()[-1])
  assert report["hf_error"] == "OutOfMemoryError: CUDA out of memory"
  # Where the run's time went, every phase in order, adding up to no more than its wall time
  # (a device run's overhead beside the timed decode).
  phases = report["phases_s"]
  assert list(phases) == ["imports", "checkpoint", "load", "sampler", "hf_load", "compile",
                          "hf_warmup", "timed", "hf_timed"]
  assert all(v >= 0 for v in phases.values()) and sum(phases.values()) <= wall + 0.1
  assert re.search(r"^\[time\] [\d.]+ s in all: imports [\d.]+, checkpoint", out.err, re.M)
  # Each phase is logged as it ends: a run killed at its time limit shows how far it got.
  # Each timed run of ours is logged as it ends (what a run killed later still shows).
  assert len(re.findall(r"^\[decode\] ours, run [12]: \d+ tokens/s$", out.err, re.M)) == 2
  # (--quick runs 2 repeats: "timed" and "hf_timed" end twice, their sums logged)
  logged = re.findall(r"^\[time\] (\w+): [\d.]+ s$", out.err, re.M)
  assert list(dict.fromkeys(logged)) == list(phases) and len(logged) == len(phases) + 2
  assert report["ours_tok_s"] > 0 and "hf_tok_s" not in report and "ratio" not in report
  assert "[decode] transformers failed, no comparison: OutOfMemoryError" in out.err


def test_view_bench_quick_gives_the_same_views_both_ways():
  """view_bench checks paged_view against the whole-pages gather it replaced (an
  independent formulation) before timing them, and says so."""
  res = _json("view_bench.py", "--quick", "--json")
  assert res["equal"] is True and res["speedup"] > 0
  assert set(res["median_s"]) == {"paged_view", "whole_pages"}


def test_rows_bench_quick_runs_a_tail_on_fewer_rows_with_the_same_tokens(tmp_path):
  """rows_bench checks that the sampler on fewer rows gives the all-slots tokens, and
  counts the chunks that ran on fewer rows (none would mean it timed nothing new)."""
  res = _json("rows_bench.py", "--quick", "--json", "--cache", str(tmp_path))
  (w,) = res["workloads"].values()
  assert w["same_tokens"] is True and w["row_buckets"] == [8, 4]
  assert 0 < w["chunks_on_fewer_rows"][0] < w["chunks_on_fewer_rows"][1]
  assert set(w["median_s"]) == {"rows", "all_slots"} and w["speedup"] > 0
