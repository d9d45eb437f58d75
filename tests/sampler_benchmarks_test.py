"""The sampler benchmarks run end to end at small shapes and print what they promise."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _json(script, *args):
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                       capture_output=True, text=True, timeout=600, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # spawns torch; the engine tests check greedy parity in the default run
def test_sampler_bench_quick_matches_transformers_greedy():
  r = _json("sampler_bench.py", "--quick", "--skip-mixed", "--repeats", "1", "--json")
  assert r["greedy_match"] == 1.0  # same checkpoint, same tokens as transformers generate
  for key in ("ours_tok_s", "hf_tok_s", "ratio", "compute_limit_tok_s", "fraction_of_limit"):
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
