"""benchmarks/gpu/gpu_suite.py on CPU: its plan, argument checks, the parsing and summary of the
benches' reports, and (slow) every variant at tiny shapes (the measurements need a GPU)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
from benchmarks.common import random_checkpoint  # noqa: E402
from benchmarks.gpu import gpu_suite  # noqa: E402

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


def test_dry_run_covers_every_device_item_of_issue_34():
  """The plan: decode kernel vs gather at batch 256 and 64 on the Qwen3-0.6B shape (128 +
  512, bf16), a profile, command buffers off, transformers; the train step's headline
  shapes with cuDNN, remat and logits-chunk variants, the latency-hiding scheduler, einsum
  baselines; every train run measures a bf16 matmul peak."""
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "gpu_suite.py"),
                        "--dry-run"], capture_output=True, text=True, timeout=60, check=True)
  lines = out.stdout.strip().splitlines()
  assert len(lines) == len(gpu_suite.RUNS) == 23
  assert lines[0].startswith("decode_kernel_check (item 2)")
  assert "paged_decode_check.py" in lines[0] and "--sweep" not in lines[0]
  # Then the train step's loss and gradients with cuDNN against einsum (the correctness
  # target), at its GPU shapes (no --quick).
  assert lines[1].startswith("attention_check (item 1): python3 "
                             "benchmarks/gpu/train_attention_check.py --json")
  # After the checks: the 1.7B target (remat keeping the attention kernel's outputs, 36.3%
  # on the H100; remat full, its baseline in the same call; remat full with cuBLAS GEMMs),
  # all while the decode checkpoint is written in the background; the batch-256 decode
  # target with transformers, then with cuBLAS GEMMs and without command buffers (the flags
  # still unmeasured there), the batch-64 target, the 0.6B step, the kernel sweep and decode
  # at batch 256 with its fastest configuration (only if that is not the defaults), then
  # remat keeping the attention block's outputs (at 2 micro-batches: 1 does not fit an H100).
  names = [x.split(" ")[0] for x in lines]
  assert names[2:14] == [
      "train_1p7b_16x4096_cudnn_context", "train_1p7b_16x4096_cudnn_full",
      "train_1p7b_16x4096_cudnn_full_cublas", "decode_b256_triton",
      "decode_b256_triton_cublas", "decode_b256_triton_no_command_buffers",
      "decode_b64_triton", "train_0p6b_32x2048_cudnn_full", "decode_kernel_sweep",
      "decode_b256_triton_tuned", "train_1p7b_16x4096_cudnn_attention",
      "train_0p6b_32x2048_cudnn_full_cublas"]
  assert "--remat context" in lines[2] and "--profile" in lines[2]
  assert "--remat full" in lines[3] and "--remat attention" in lines[12]
  assert lines[4].split(": ", 1)[1].startswith("XLA_FLAGS=--xla_gpu_enable_triton_gemm=false ")
  # On an H100 the plan sizes remat "context" at one micro-batch, "attention" at two.
  h100 = {r["name"]: r for r in gpu_suite.plan(81559, "/tmp/ck")}
  assert h100["train_1p7b_16x4096_cudnn_context"]["micro_batches"] == 1
  assert h100["train_1p7b_16x4096_cudnn_attention"]["micro_batches"] == 2
  # At two micro-batches the plan had XLA recompute nothing (at one: 74 values).
  assert h100["train_1p7b_16x4096_cudnn_attention"]["predicted"]["xla_rematerialized"] == 0
  assert "paged_decode_check.py --sweep" in lines[10]
  assert "--batch 256 " in lines[11] and "--decode-attention triton " in lines[11]
  assert not any("--triton-config" in x for x in lines)  # added only once the sweep ran
  # The batch-256 target run is profiled and times transformers on the same device.
  assert lines[5].startswith("decode_b256_triton (item 2)") and "--profile" in lines[5]
  assert "--skip-hf" not in lines[5]
  decode = [x for x in lines if "sampler_bench.py" in x]
  assert len(decode) == 7 and all("--save-tokens" in x for x in decode)
  for batch in (64, 256):
    for impl in ("triton", "gather"):
      assert sum(x.startswith(f"decode_b{batch}_{impl} ") and f"--batch {batch} " in x
                 and "--prompt-len 128 --new-tokens 512" in x and "--dtype bfloat16" in x
                 and f"--decode-attention {impl}" in x for x in decode) == 1
  assert sum("XLA_FLAGS=--xla_gpu_enable_command_buffer= " in x for x in decode) == 1
  assert sum("XLA_FLAGS=--xla_gpu_enable_triton_gemm=false " in x for x in decode) == 1
  assert sum("--skip-hf" not in x for x in decode) == 1  # transformers once
  train = [x for x in lines if x.startswith("train_")]
  assert all("--matmul-dtype bfloat16" in x and "--steps 3" in x for x in train)
  assert sum("--preset qwen3_1p7b --seq-len 4096 --prompts 4 --generations 4" in x
             for x in train) == 5
  for remat in ("full", "dots", "attention"):
    assert any("--preset qwen3_0p6b" in x and f"--remat {remat} " in x for x in train)
  assert sum("--logits-chunk 2048" in x for x in train) == 1
  assert sum(x.split(": ", 1)[1].startswith(
      "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true ") for x in train) == 1
  assert sum(x.split(": ", 1)[1].startswith(
      "XLA_FLAGS=--xla_gpu_enable_triton_gemm=false ") for x in train) == 2
  assert sum("--attention einsum" in x for x in train) == 2
  assert {item for _, item, _, _ in gpu_suite.RUNS} == {1, 2, 3, 4, 5, 6, 7}
  # Item 6 last: the README's demo command as is (no overrides), into a fresh directory.
  assert names[-1] == "demo_cpu_tiny"
  demo = lines[-1].split(": ", 1)[1]
  assert demo.split(" --output-dir ")[0].endswith(
      "-m jaxrl_scale.cli train " + os.path.join(ROOT, "configs", "cpu_tiny.yaml"))


def test_without_predictions_a_small_gpu_splits_the_1p7b_batch():
  checkpoint = "/tmp/ck"
  h100 = gpu_suite.plan(81559, checkpoint, predicted={})
  assert {r["micro_batches"] for r in h100 if r.get("preset") == "qwen3_1p7b"} == {2}
  assert {r["micro_batches"] for r in h100 if r.get("preset") == "qwen3_0p6b"} == {1}
  h200 = gpu_suite.plan(143771, checkpoint, predicted={})
  assert {r["micro_batches"] for r in h200 if r["bench"] == "train_step_bench"} == {1}
  assert not any(r.get("skip") for r in h100 + h200)


def test_train_runs_are_sized_by_the_predictions():
  """One micro-batch when its prediction leaves 20% of 90% of the GPU free, else two, else
  the run is skipped with the reason (never started to run out of memory)."""
  gib = 2**30
  mib = 81559  # an H100: 90% is 71.7 GiB, so a prediction fits up to 59.7 GiB
  predicted = {("train_0p6b_32x2048_cudnn_full", 1): 31 * gib,
               ("train_0p6b_32x2048_cudnn_dots", 1): 110 * gib,
               ("train_0p6b_32x2048_cudnn_dots", 2): 59 * gib,
               ("train_0p6b_32x2048_cudnn_full_chunk2048", 1): 87 * gib,
               ("train_0p6b_32x2048_cudnn_full_chunk2048", 2): 61 * gib}
  runs = {r["name"]: r for r in gpu_suite.plan(mib, "/tmp/ck", predicted=predicted)}
  assert runs["train_0p6b_32x2048_cudnn_full"]["micro_batches"] == 1
  assert runs["train_0p6b_32x2048_cudnn_dots"]["micro_batches"] == 2
  assert "--micro-batches 2" in " ".join(runs["train_0p6b_32x2048_cudnn_dots"]["argv"])
  skipped = runs["train_0p6b_32x2048_cudnn_full_chunk2048"]
  assert "predicted 61.0 GiB" in skipped["skip"] and "71.7 GiB" in skipped["skip"]
  assert all(r["env"].get("XLA_PYTHON_CLIENT_MEM_FRACTION") == "0.9" for r in runs.values()
             if r["bench"] == "train_step_bench")
  assert not any("XLA_PYTHON_CLIENT_MEM_FRACTION" in r["env"] for r in runs.values()
                 if r["bench"] != "train_step_bench")


def test_the_committed_predictions_cover_every_train_run():
  """benchmarks/results/gpu_plan_{h100,h200}.json (gpu_plan.py) predict every train run at
  one and two micro-batches, so the suite sizes none of them by the fallback."""
  names = {name for name, _, bench, _ in gpu_suite.RUNS if bench == "train"}
  for mib in (81559, 143771):
    predicted = gpu_suite.predictions(mib)
    assert {(n, m) for n in names for m in (1, 2)} <= set(predicted), mib
    # Each train run the suite would time carries the plan's bounds for its micro-batches,
    # for the summary's step_over_kernel_bound.
    for run in gpu_suite.plan(mib, "/tmp/ck"):
      if run["bench"] == "train_step_bench" and not run.get("skip"):
        pred = run["predicted"]
        assert pred["kernel_bound_seconds"] >= pred["bound_seconds"] > 0, run["name"]
        by_family = pred["kernel_bound_ms_by_family"]
        # cuDNN's fused attention is its own family; the einsum baseline's is matmuls.
        assert "matmul" in by_family, run["name"]
        assert ("attention" in by_family) == (run["attention"] == "cudnn"), run["name"]
        assert sum(by_family.values()) == pytest.approx(
            pred["kernel_bound_seconds"] * 1e3, rel=1e-3), run["name"]


def test_the_demo_summary_lines_are_read_back():
  """parse_demo on the run summary as the trainer renders it (`pipeline.summary.render`),
  with and without a step-0 eval, and on the roles line of a one-GPU run; the suite's
  summary keeps it with the exit code. (The smoke test reads a real demo's output.)"""
  from jaxrl_scale.pipeline import summary as run_summary

  base = dict(outcome="done", steps=200, compute_hours=0.1, sft_compute_hours=0.01,
              flops=1e15, rl_wall_s=88.0, eval_s=3.0, checkpoint_s=2.0, compile_s=20.0,
              final_pass_rate=0.9431, final_step=200)
  text = ("  mode pipeline | gpu colocated: 1 devices [0] (fsdp=1, tp=1)\n"
          + run_summary.render(dict(base, start_pass_rate=0.4162)))
  got = gpu_suite.parse_demo(text)
  assert got == dict(mode="pipeline", backend="gpu", colocated=True,
                     devices="colocated: 1 devices [0] (fsdp=1, tp=1)", final_pass_rate=0.943,
                     final_step=200, start_pass_rate=0.416, rl_time=got["rl_time"])
  assert got["rl_time"].startswith("1m")
  assert "start_pass_rate" not in gpu_suite.parse_demo(run_summary.render(base))
  runs = [dict(name="demo_cpu_tiny", bench="jaxrl_scale_train", rc=0, seconds=88.0,
               report=got)]
  assert gpu_suite.summary(runs)["demo"] == dict(rc=0, seconds=88.0, **got)


@pytest.mark.slow
def test_the_demo_run_is_read_from_the_demos_own_output(tmp_path):
  """parse_demo on what `jaxrl-scale train` prints (the smoke-length demo run here, on CPU,
  where the roles get their own devices); the summary keeps it with the exit code."""
  out_dir = tmp_path / "demo"
  proc = subprocess.run(
      [sys.executable, *gpu_suite.demo_argv(str(out_dir), smoke=True)], cwd=ROOT,
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = gpu_suite.parse_demo(proc.stdout + proc.stderr)
  assert got["backend"] == "cpu" and got["mode"] == "pipeline" and not got["colocated"]
  assert got["devices"].startswith("trainer: 4 devices")
  assert got["final_step"] == 2 and 0 <= got["final_pass_rate"] <= 1
  assert 0 <= got["start_pass_rate"] <= 1 and got["rl_time"]
  # A one-GPU run's header, as the wiring prints it.
  assert gpu_suite.parse_demo("  mode pipeline | gpu colocated: 1 devices [0] (fsdp=1, tp=1)")[
      "colocated"]
  runs = [dict(name="demo_cpu_tiny", bench="jaxrl_scale_train", rc=0, seconds=88.0,
               report=got)]
  assert gpu_suite.summary(runs)["demo"] == dict(rc=0, seconds=88.0, **got)


def test_summary_keeps_why_transformers_did_not_compare():
  runs = [dict(name="decode_b256_triton", rc=0, report=dict(
      ours_tok_s=30000.0, hf_error="OutOfMemoryError: CUDA out of memory", hf_device="cuda"))]
  assert gpu_suite.summary(runs)["decode_b256_vs_transformers"] == dict(
      hf_error="OutOfMemoryError: CUDA out of memory", hf_device="cuda")


def test_unknown_only_is_refused():
  with pytest.raises(SystemExit):
    gpu_suite.parse_args(["--only", "decode_b128"])
  assert [r["name"] for r in gpu_suite.plan(None, "/tmp/ck", only=["decode_b64"])] == [
      "decode_b64_triton", "decode_b64_gather"]


def test_summary_compares_kernel_with_gather_and_variants_with_their_base(tmp_path):
  runs = [dict(name="decode_b256_triton", rc=0, report=dict(
              ours_tok_s=30000.0, fraction_of_roofline=0.3, hf_tok_s=6000.0, ratio=5.0,
              hf_device="cuda", greedy_match=0.9)),
          dict(name="decode_b256_gather", rc=0, report=dict(ours_tok_s=20000.0,
                                                              fraction_of_roofline=0.2)),
          dict(name="decode_b256_triton_cublas", rc=0, report=dict(
              ours_tok_s=33000.0, fraction_of_roofline=0.33)),
          dict(name="decode_b256_triton_tuned", rc=0, report=dict(
              ours_tok_s=36000.0, fraction_of_roofline=0.36,
              triton=dict(kv_tokens_per_block=128, num_warps=8))),
          dict(name="decode_b64_triton", rc=1, report=None),
          dict(name="decode_b64_triton_tuned", rc=0, report=dict(
              ours_tok_s=9000.0, hf_error="OutOfMemoryError: CUDA out of memory",
              hf_device="cuda")),
          dict(name="train_0p6b_32x2048_cudnn_full", rc=0,
               report=dict(median_step_s=2.0, family_ms_per_step={
                   "matmul": 900.0, "attention": 300.0, "other": 700.0, "copy": 100.0},
                   xla_rematerialized=3),
               predicted=dict(temp_gib=27.7, bound_seconds=0.46, kernel_bound_seconds=0.8,
                              kernel_bound_ms_by_family={"matmul": 450.0, "attention": 100.0,
                                                         "other": 250.0},
                              xla_rematerialized=0)),
          dict(name="train_0p6b_32x2048_cudnn_dots", rc=0, report=dict(median_step_s=1.5))]
  tokens = np.zeros((4, 8), np.int32)
  np.save(tmp_path / "tokens_decode_b256_triton.npy", tokens)
  tokens[0, 6:] = 1  # diverged at the last two steps of one row
  np.save(tmp_path / "tokens_decode_b256_gather.npy", tokens)
  got = gpu_suite.summary(runs, str(tmp_path))
  assert got["decode_b256"]["triton_over_gather"] == 1.5
  assert got["decode_b256"]["greedy_tokens_equal"] == 30 / 32
  assert got["decode_b256_vs_transformers"] == dict(ours_tok_s=30000.0, hf_tok_s=6000.0,
                                                    ratio=5.0, hf_device="cuda",
                                                    greedy_match=0.9)
  assert "decode_b64" not in got  # its kernel run failed
  assert "decode_b64_vs_transformers" not in got
  assert got["decode_b256_triton_cublas"] == dict(ours_tok_s=33000.0, fraction_of_roofline=0.33,
                                                  over_triton=1.1)
  assert got["decode_b256_triton_tuned"] == dict(
      ours_tok_s=36000.0, fraction_of_roofline=0.36, over_triton=1.2,
      triton=dict(kv_tokens_per_block=128, num_warps=8))
  assert "decode_b64_triton_tuned" not in got  # its base (the untuned run) failed
  assert got["train_0p6b_32x2048_cudnn_dots"]["step_over_cudnn_full"] == 0.75
  full = got["train_0p6b_32x2048_cudnn_full"]
  assert full["step_over_kernel_bound"] == 2.5 and full["predicted"]["temp_gib"] == 27.7
  # What XLA recomputed on the device beside what the plan said it would.
  assert full["xla_rematerialized"] == 3 and full["predicted"]["xla_rematerialized"] == 0
  # Each profiled family against its share of the bound (no bound for copies: no ratio).
  assert full["family_over_kernel_bound"] == {"matmul": 2.0, "attention": 3.0, "other": 2.8}
  assert "step_over_kernel_bound" not in got["train_0p6b_32x2048_cudnn_dots"]  # no plan


def test_busy_time_is_the_union_of_stream_intervals():
  from benchmarks.common import gpu_profile

  # Two streams overlapping on [5, 8), a gap [12, 20), one kernel inside another.
  assert gpu_profile.busy_ns([(0, 8), (5, 12), (20, 30), (22, 25)]) == 22
  assert gpu_profile.busy_ns([]) == 0


def test_profile_summary_ranks_kernels_and_families_per_step():
  """Kernel names as a Hopper profile shows them (cuBLAS/cuDNN/XLA fusions/our Triton
  kernel); times in ns over 2 steps, wall 100 us."""
  from benchmarks.common import gpu_profile

  events = [
      ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 0, 30_000),
      ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 40_000, 60_000),
      ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", 60_000, 70_000),
      ("paged_decode_attention", 70_000, 75_000),
      ("loop_multiply_fusion_3", 10_000, 35_000),  # on a second stream, overlapping
      ("input_concatenate_fusion", 80_000, 82_000),
      ("Memcpy DtoD", 90_000, 91_000)]
  got = gpu_profile.summarize(events, wall_s=100e-6, steps=2, top=3)
  # busy: [0, 35) + [40, 75) + [80, 82) + [90, 91) us = 73 us
  assert got["gpu_busy_s"] == round(73e-6, 4) and got["gpu_busy_fraction"] == 0.73
  assert got["gpu_busy_ms_per_step"] == round(73e-3 / 2, 4)
  assert got["family_ms_per_step"] == {"matmul": 0.025, "other": 0.0135, "attention": 0.0075,
                                       "copy": 0.0005}
  assert [(k["name"][:14], k["ms_per_step"], k["calls"], k["family"])
          for k in got["top_kernels"]] == [
      ("sm90_xmma_gemm", 0.025, 2, "matmul"), ("loop_multiply_", 0.0125, 1, "other"),
      ("cudnn_generate", 0.005, 1, "attention")]


def test_runs_import_the_tree_on_a_machine_without_an_install(monkeypatch):
  """The device machine gets the tree copied, not pip-installed: each bench finds
  jaxrl_scale through the suite's PYTHONPATH. `-S` hides site-packages (where the editable
  install lives) from the probe; without the suite's PYTHONPATH the import fails, as every
  train run did under jax 0.11.2 in a venv without the package."""
  monkeypatch.setenv("PYTHONPATH", "/nonexistent")  # the caller's entries are kept after ROOT
  probe = ("import os, jaxrl_scale; print(os.path.dirname(os.path.dirname("
           "os.path.abspath(jaxrl_scale.__file__)))); print(os.environ['PYTHONPATH'])")
  run = dict(name="probe", bench="train_step_bench", env={}, argv=["-S", "-c", probe])
  result = gpu_suite.run_one(run, lambda _: None, 60.0)
  assert result["rc"] == 0, result["output_tail"]
  root, path = result["output_tail"].strip().splitlines()
  assert root == ROOT
  assert path.split(os.pathsep) == [ROOT, "/nonexistent"]


def test_parse_train_reads_the_report():
  assert gpu_suite.parse_train(TRAIN_REPORT) == {
      "params_m": 0.1, "compile_s": 11.6, "temp_gib": 0.01, "model_tflop_per_step": 0.001,
      "median_step_s": 0.066, "gflop_s": 11.5, "matmul_peak_gflop_s": 57.8}


def test_mfu_counts_causal_attention_as_half():
  from benchmarks.train import train_step_bench
  from jaxrl_scale.models import config as model_config

  # qwen3_0p6b: 28 layers, 16 heads of 128; 32 x 2048 tokens.
  cfg = model_config.preset("qwen3_0p6b")
  assert train_step_bench.attention_flops(cfg, 32, 2048) == 12 * 28 * 16 * 128 * 2048 * (
      32 * 2048)
  assert train_step_bench.spec_peak("NVIDIA H100 80GB HBM3") == 989.0
  assert train_step_bench.spec_peak("NVIDIA H200") == 989.0
  assert train_step_bench.spec_peak("cpu") is None


def test_past_the_budget_every_run_is_recorded_as_skipped(tmp_path, monkeypatch):
  """The files come back even when nothing ran: header (device, versions, commit) + runs."""
  import importlib.metadata
  import json

  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  # The suite clears its tokens folder: this one's, not the machine's temp folder's.
  monkeypatch.setattr(gpu_suite.tempfile, "gettempdir", lambda: str(tmp_path))
  rc = gpu_suite.main(["--out", str(tmp_path), "--budget-s", "-1", "--commit", "abc123"])
  assert rc == 0
  train = json.loads((tmp_path / "train_step_bench.json").read_text())
  sampler = json.loads((tmp_path / "sampler_bench.json").read_text())
  suite = json.loads((tmp_path / "gpu_suite.json").read_text())
  assert train["device"] == "NVIDIA H100 80GB HBM3" and train["commit"] == "abc123"
  import jax
  assert train["jax"] == jax.__version__
  assert train["packages"]["flax"] == importlib.metadata.version("flax")
  assert [r["name"] for r in suite["runs"]] == [name for name, *_ in gpu_suite.RUNS]
  assert [r["batch"] for r in sampler["runs"]] == [256, 256, 256, 64, 256, 256, 64]
  assert len(train["runs"]) == 12
  assert all(r["skipped"] == "budget" for r in suite["runs"])
  assert suite["summary"] == {}
  assert "skipped" in (tmp_path / "gpu_suite.log").read_text()


def test_a_decode_run_killed_while_transformers_runs_keeps_its_own_numbers(tmp_path):
  """A sampler run killed at its limit after its own timed runs (transformers still
  generating, as on the H100 on 2026-11-27b) keeps the best of them, marked partial, and the
  summary reads it; a run killed before any timed run has no report."""
  script = ("import sys, time; print('[decode] ours, run 1: 29000 tokens/s (42.1% of the HBM "
            "roofline)', flush=True); print('[decode] ours, run 2: 30500 tokens/s (44.3% of "
            "the HBM roofline)', flush=True); print('[time] hf_timed: 1.0 s', flush=True); "
            "time.sleep(60)")
  run = dict(name="decode_b256_triton", item=2, bench="sampler_bench", batch=256,
             argv=["-c", script], env={})
  result = gpu_suite.run_one(run, lambda text: None, timeout=3.0)
  assert result["rc"] == 124
  assert result["report"] == {"ours_tok_s": 30500.0, "fraction_of_roofline": 0.443,
                              "partial": True}
  gather = dict(name="decode_b256_gather", rc=0, report={"ours_tok_s": 16000.0,
                                                         "fraction_of_roofline": 0.23})
  summary = gpu_suite.summary([result, gather])
  assert summary["decode_b256"]["triton_tok_s"] == 30500.0
  assert summary["decode_b256"]["triton_fraction_of_roofline"] == 0.443
  early = gpu_suite.run_one(dict(run, argv=["-c", "import time; time.sleep(60)"]),
                            lambda text: None, timeout=1.0)
  assert early["rc"] == 124 and early["report"] is None


@pytest.mark.parametrize("fails", [False, True])
def test_the_checkpoint_is_written_while_the_first_runs_go_on(tmp_path, monkeypatch, fails):
  """main, its runs stubbed, the writer a 1-second process: the runs before the first decode
  run start while the checkpoint is still being written (not after it), the decode runs
  start once it is there; a failed write skips the decode runs with its cause and the
  other runs still run."""
  import json

  seen = []
  checkpoint = tmp_path / "gpu_suite_qwen3_0p6b"

  def fake_run(run, log, timeout):
    seen.append((run["name"], checkpoint.is_dir()))
    return {**{k: v for k, v in run.items() if k != "argv"}, "rc": 0, "report": None}

  script = ("import os, sys, time; time.sleep(1); "
            + ("sys.exit('OSError: disk full')" if fails else "os.makedirs(sys.argv[1]); "
               "print('import 0.1 s, random init 0.2 s, save 0.3 s')"))
  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  monkeypatch.setattr(gpu_suite, "run_one", fake_run)
  monkeypatch.setattr(gpu_suite.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(random_checkpoint, "writer_command",
                      lambda path: [sys.executable, "-c", script, path])
  assert gpu_suite.main(["--out", str(tmp_path / "out"), "--commit", "abc", "--only",
                         "decode_kernel_check,train_1p7b_16x4096_cudnn_context,"
                         "decode_b256_gather,decode_b64_gather,train_0p6b_32x2048_einsum"]
                        ) == 0
  log = (tmp_path / "out" / "gpu_suite.log").read_text()
  runs = {r["name"]: r for r in json.loads(
      (tmp_path / "out" / "gpu_suite.json").read_text())["runs"]}
  assert seen[:2] == [("decode_kernel_check", False), ("train_1p7b_16x4096_cudnn_context", False)]
  if not fails:
    assert seen[2:] == [("decode_b256_gather", True), ("decode_b64_gather", True),
                        ("train_0p6b_32x2048_einsum_full", True)]
    assert "=== wrote the Qwen3-0.6B-shaped checkpoint in" in log
    assert "(import 0.1 s, random init 0.2 s, save 0.3 s)" in log
  else:
    assert seen[2:] == [("train_0p6b_32x2048_einsum_full", False)]
    for name in ("decode_b256_gather", "decode_b64_gather"):
      assert runs[name]["skipped"] == ("writing the checkpoint failed (exit 1): "
                                       "OSError: disk full")


def test_a_killed_write_leaves_no_checkpoint_that_looks_whole(tmp_path, monkeypatch):
  """The checkpoint appears under its name only once saved whole: a write that dies while
  saving leaves only PATH.partial, so a later suite writes it again instead of loading half."""
  import types

  class Model:
    def eval(self):
      return self

    def save_pretrained(self, path):
      os.makedirs(path)
      (pathlib.Path(path) / "config.json").write_text("{}")
      raise OSError("No space left on device")

  fake = types.SimpleNamespace(
      Qwen3Config=lambda **kw: kw,
      AutoModelForCausalLM=types.SimpleNamespace(from_config=lambda cfg, dtype: Model()))
  monkeypatch.setitem(sys.modules, "transformers", fake)
  with pytest.raises(OSError, match="No space"):
    random_checkpoint.write_qwen3_0p6b(str(tmp_path / "ck"))
  assert not (tmp_path / "ck").exists() and (tmp_path / "ck.partial").is_dir()


@pytest.mark.slow
def test_cpu_smoke_runs_every_variant(tmp_path):
  """Every variant at tiny shapes on CPU (the Triton kernel in interpret mode, the profile,
  the XLA flags): none crashes, each writes its JSON report, and --out holds only what the
  device tool brings back (about 5 minutes on 2 cores)."""
  import json

  subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "gpu_suite.py"),
                  "--cpu-smoke", "--out", str(tmp_path)], capture_output=True, text=True,
                 timeout=1500, check=True)
  suite = json.loads((tmp_path / "gpu_suite.json").read_text())
  assert len(suite["runs"]) == len(gpu_suite.RUNS)
  assert all(r["rc"] == 0 and r["report"] for r in suite["runs"])
  assert {r["report"]["decode_attention"] for r in suite["runs"]
          if r["bench"] == "sampler_bench"} == {"triton", "gather"}
  # The device tool brings back at most 8 files from $OUT: everything the suite writes.
  assert sorted(os.listdir(tmp_path)) == [
      "gpu_suite.json", "gpu_suite.log", "paged_decode_check.json", "sampler_bench.json",
      "train_step_bench.json"]
  # The tokens stayed out of $OUT, but the kernel/gather comparison still read them.
  assert suite["summary"]["decode_b256"]["greedy_tokens_equal"] == 1.0
  assert suite["summary"]["decode_b64"]["greedy_tokens_equal"] == 1.0
  assert suite["summary"]["decode_kernel_bf16"]["triton_vs_f32"] < 0.05
  # The train step's loss and gradients through the cuDNN path's code (XLA's implementation
  # here) within tolerance of the einsum path, read back into the summary.
  attn = suite["summary"]["train_attention"]
  assert attn["passed"] is True and attn["kernel"] == "xla"
  assert set(attn["ways"]) == {"einsum", "cudnn"}
  swept = suite["summary"]["decode_kernel_sweep"]
  assert swept["errors"] == 0 and set(swept["best"]) == {"4"}
