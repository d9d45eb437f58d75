"""benchmarks/gpu_suite.py on CPU: its plan, argument checks and the parsing of the benches'
reports (the measurements themselves need a GPU)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_suite  # noqa: E402  (benchmarks/ is not a package)

# train_step_bench --quick's report, as printed on this machine.
TRAIN_REPORT = """\
device: cpu x1 (cpu), mesh fsdp=1 tp=1
model: tiny_llama, 0.1M params, batch 8 x 128 tokens, 1 micro-batch(es), remat full, logits \
chunk 512, attention einsum, float32 activations over float32 params; compile 11.6 s
memory: temporaries 0.01 GiB, arguments 0.00 GiB
model FLOPs per step: 0.001 TFLOP
per step: 0.06 s, 12.0 GFLOP/s vs peak 57.8 = 20.7%; 0.07 s, 11.0 GFLOP/s vs peak 57.8 = 19.1%
train step: 11.5 GFLOP/s (median step 0.066 s)
float32 matmul peak (1024^2): 57.8 GFLOP/s (median; all: 57.5, 57.8, 57.8)
fraction of peak: 19.9% (median of per-step ratios)
"""


def test_dry_run_lists_every_bench_with_both_attention_paths():
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"),
                        "--dry-run"], capture_output=True, text=True, timeout=60, check=True)
  lines = out.stdout.strip().splitlines()
  assert len(lines) == 8
  for impl in ("einsum", "cudnn"):
    mine = [x for x in lines if x.endswith(f"--attention {impl}")]
    assert len(mine) == 4
    assert sum("--preset qwen3_1p7b --seq-len 4096 --prompts 4 --generations 4" in x
               and "--remat full" in x and "--dtype bfloat16" in x for x in mine) == 1
    assert sum("--preset qwen3_0p6b --seq-len 2048 --prompts 4 --generations 8" in x
               for x in mine) == 1
    for batch in (64, 256):
      assert sum(f"--batch {batch} --prompt-len 128 --new-tokens 512" in x
                 and "--dtype bfloat16" in x and "--skip-hf" in x for x in mine) == 1


def test_small_gpu_splits_the_1p7b_batch_for_both_paths():
  runs = gpu_suite.train_runs(["einsum", "cudnn"], gpu_mib=81559)  # an H100
  assert [r["micro_batches"] for r in runs] == [2, 2, 1, 1]
  runs = gpu_suite.train_runs(["einsum", "cudnn"], gpu_mib=143771)  # an H200
  assert [r["micro_batches"] for r in runs] == [1, 1, 1, 1]


def test_bad_impl_is_refused():
  with pytest.raises(SystemExit):
    gpu_suite.parse_args(["--impls", "einsum,flash"])


def test_parse_train_reads_the_report():
  assert gpu_suite.parse_train(TRAIN_REPORT) == {
      "params_m": 0.1, "compile_s": 11.6, "temp_gib": 0.01, "model_tflop_per_step": 0.001,
      "median_step_s": 0.066, "gflop_s": 11.5, "fp32_matmul_peak_gflop_s": 57.8}


def test_mfu_counts_causal_attention_as_half():
  # qwen3_0p6b: 28 layers, 16 heads of 128; 32 x 2048 tokens.
  run = dict(preset="qwen3_0p6b", rows=32, seq_len=2048)
  attention = 12 * 28 * 16 * 128 * 2048 * (32 * 2048)
  full = 100e12
  got = gpu_suite.mfu(run, {"median_step_s": 0.5, "model_tflop_per_step": full / 1e12},
                      "NVIDIA H100 80GB HBM3")
  assert got["tflop_s_full_attention"] == pytest.approx(200.0)
  assert got["tflop_s_causal_attention"] == pytest.approx((full - attention / 2) / 0.5 / 1e12)
  assert got["mfu_full_attention"] == pytest.approx(200.0 / 989.0)
  assert "mfu_full_attention" not in gpu_suite.mfu(
      run, {"median_step_s": 0.5, "model_tflop_per_step": 100.0}, "unknown (no nvidia-smi)")


def test_past_the_budget_every_run_is_recorded_as_skipped(tmp_path, monkeypatch):
  """The files come back even when nothing ran: header (device, versions, commit) + runs."""
  import json

  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  rc = gpu_suite.main(["--out", str(tmp_path), "--budget-s", "-1", "--commit", "abc123"])
  assert rc == 0
  train = json.loads((tmp_path / "train_step_bench.json").read_text())
  sampler = json.loads((tmp_path / "sampler_bench.json").read_text())
  assert train["device"] == "NVIDIA H100 80GB HBM3" and train["commit"] == "abc123"
  import jax
  assert train["jax"] == jax.__version__
  assert [r["name"] for r in train["runs"]] == [
      "qwen3_1p7b_16x4096_einsum", "qwen3_1p7b_16x4096_cudnn",
      "qwen3_0p6b_32x2048_einsum", "qwen3_0p6b_32x2048_cudnn"]
  assert [r["batch"] for r in sampler["runs"]] == [256, 256, 64, 64]
  assert all(r["skipped"] == "budget" for r in train["runs"] + sampler["runs"])
  assert "skipped" in (tmp_path / "gpu_suite.log").read_text()
