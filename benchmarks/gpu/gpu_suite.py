"""The GPU measurements of issue 34 (and, `--suite loop`, issue 62's) in one run, each
variant in its own process.

    GIT_COMMIT=$(git rev-parse HEAD) python3 benchmarks/gpu/gpu_suite.py   # on the GPU
    ... gpu_suite.py --only decode_b256_triton_tuned --sweep-from PATH      # a second call
    python benchmarks/gpu/gpu_suite.py --dry-run    # the plan, anywhere
    python benchmarks/gpu/gpu_suite.py --cpu-smoke  # every variant, tiny
    ... gpu_suite.py --suite loop ...               # issue 62's runs: loop_suite.py

The rest of this docstring is the default suite's, issue 34's.

The variants, most important first (a budget cut drops the tail; `RUNS` has each one's
issue item): the decode kernel's check; the train step's loss and gradients with cuDNN's
attention against the einsum path and a float32 reference (`train_attention_check.py`,
issue 34's correctness target); the 1.7B step with remat keeping the attention kernel's
output ("context"), with remat full (its baseline in the same call) and with remat full and
cuBLAS for every GEMM; decode with the Triton kernel at batch 256 (with transformers on the
same GPU), the same with cuBLAS GEMMs and without XLA's command buffers, and at batch 64;
the 0.6B step; the kernel sweep (its block sizes, warps, pipeline stages and split target)
and decode at batch 256 with the sweep's fastest configuration where that is not the
defaults; then remat keeping the attention block's outputs, cuBLAS for the 0.6B step, the
comparisons (the gather, remat, flags, logits chunk, the einsum baselines), and last the
README's demo command on the GPU (item 6: `jaxrl-scale train configs/cpu_tiny.yaml`,
colocated by itself on one GPU; the summary keeps where its roles ran and its validation
pass rate before and after RL). The H100 runs of 2026-11-28
(benchmarks/results/gpu_h100_2026-11-28*/) met every target and set this order: the
targets again, then the flags whose effect on the 1.7B step and decode is unmeasured. The decode
runs' checkpoint (45-52 s to write on the device then) is written by a background process
from the suite's start (`random_checkpoint.CheckpointWriter`, CPU only), while the first
runs, which do not read it, go on; the first decode run waits for it. Each sampler_bench
run reports where its time went beside the timed decode (`phases_s`: imports, load,
compile, transformers' load and warm-up, the timed runs, the profile).

- the decode kernel's numbers on the device first (paged_decode_check: the Triton kernel
  against the gather and a float32 attention, bf16 and float32, at Qwen3-0.6B's attention
  shape, with each read's time and GB/s of live KV; the tests can only run it in interpret
  mode on CPU); after the targets' runs, its block sizes, warps, pipeline stages and split
  target beside `paged_triton`'s defaults at batch 64 and 256 (`--sweep`: what to set the
  defaults to); the decode run marked tuned uses the fastest at its batch.
- decode (sampler_bench): a random Qwen3-0.6B-shaped checkpoint (hidden 1024, 28 layers,
  16 heads of 128, 8 kv heads, MLP 3072, vocab 151936, tied; written once with
  transformers, in bfloat16), bf16, 128 prompt + 512 new tokens, at batch 256 and 64, with
  the Pallas Triton paged-attention kernel (`--decode-attention triton`) and with the gather
  it replaces; tok/s, the fraction of the HBM roofline, and the share of equal greedy
  tokens between the two. The batch-256 runs also profile one generation (the GPU-busy
  fraction of a decode step and its time by kernel), and the kernel's times transformers'
  generate on the same GPU in bf16 (sampler_bench --hf-device auto); two more run the
  kernel at batch 256 with cuBLAS for the layer matmuls and without XLA's command buffers
  (what they do for the host gaps).
- train step (train_step_bench, compile + 1 warm-up + 3 timed steps, bfloat16 activations
  over the presets' float32 masters): qwen3_1p7b 16 x 4096 and qwen3_0p6b 32 x 2048 with
  cuDNN attention, remat full; on both, cuBLAS instead of XLA's Triton GEMMs and remat
  attention (the attention block's outputs kept; the 1.7B at two micro-batches); on the
  1.7B, remat context (only the attention kernel's output kept, one micro-batch); on the
  0.6B shape, remat dots, logits chunk 2048 against 512, XLA's latency-hiding
  scheduler; the einsum attention last (the issue's baseline). MFU against the chip's bf16
  spec peak with full and with causal (halved) attention FLOPs, and against a bf16 8192^3
  matmul measured in the same process; the two cuDNN remat-full runs also profile one
  step (time by kernel family: matmul, attention, copy, other).

Writes to --out (default $OUT, else benchmarks/results/gpu), rewritten after every run so a
kill keeps what finished: gpu_suite.json ({device, gpu_memory_mib, jax, jaxlib, python,
packages, commit, date, runs, summary}), train_step_bench.json, sampler_bench.json and
paged_decode_check.json (the same header, their runs) and gpu_suite.log (all output): five
files, within the 8 the device tool brings back (the decode runs' tokens stay in the temp
folder; the summary, `gpu_suite_report.summary`, keeps their share of equal tokens). A run
keeps its command, extra environment, exit code, seconds, the bench's JSON report and its
output tail.

The device machine's working tree has no .git and no install: pass the commit as GIT_COMMIT;
each bench imports jaxrl_scale from this tree (PYTHONPATH) with the machine's own python3 and
packages (jax 0.11.2 there in 2026-11; `--cpu-smoke` passes with it and with 0.12.0.1).
Train runs get 90% of the GPU (XLA_PYTHON_CLIENT_MEM_FRACTION=0.9) and are sized by what
`gpu_plan.py` predicted for them without a GPU (benchmarks/results/gpu_plan_h100.json below
100 GiB of GPU memory, gpu_plan_h200.json above): one micro-batch if the prediction leaves
20% of that free, else two, else the run is skipped as not fitting rather than spending
device time on an OOM.
The run keeps the plan's temporaries and roofline bounds (`predicted`), and the summary
sets its measured step against the kernel-by-kernel bound (`step_over_kernel_bound`: how
far the kernels run from their rooflines). The suite is sized for the issue's 8 minutes:
no run starts after --budget-s and a run still going at --deadline-s is killed; each has its
own limit.
`--cpu-smoke` runs every variant at tiny shapes on this machine's CPU (the Triton kernel in
interpret mode, einsum attention for cuDNN), to show none of them crashes. The tuned decode
run reads this call's kernel sweep; a second device call that does not sweep again (the
first call's budget ends about where the sweep does) reads the first call's instead from
its gpu_suite.json copied into the tree (`--sweep-from`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # benchmarks.* and jaxrl_scale from this tree

# pylint: disable=wrong-import-position
from benchmarks.common.random_checkpoint import CheckpointWriter  # noqa: E402
from benchmarks.gpu import loop_suite  # noqa: E402
from benchmarks.gpu.loop_suite import LOOP_RUNS  # noqa: E402
from benchmarks.gpu.gpu_suite_report import (DEMO_BENCH, RL_BENCH, last_json,  # noqa: E402
                                             parse_demo, parse_loop, parse_sampler,
                                             parse_train, read_rl_summary, summary)
# pylint: enable=wrong-import-position

RESULTS = os.path.join(ROOT, "benchmarks", "results")

# Recorded in every JSON header beside jax and jaxlib: the device image's own versions, not
# our pins (the suite runs the copied tree with the machine's python3).
PACKAGES = ("jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint",
            "transformers", "torch", "numpy", "google-tunix")

LHS = "--xla_gpu_enable_latency_hiding_scheduler=true"
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="
# cuBLAS for every matmul instead of XLA's Triton GEMM fusions (NVIDIA's JAX images set it).
CUBLAS_GEMM = "--xla_gpu_enable_triton_gemm=false"

# (name, issue item, bench, options). Train options: preset, prompts x generations, seq_len,
# attention, remat, logits_chunk, xla_flags, profile; decode: batch, decode attention,
# profile, hf, xla_flags, tuned (the block configuration the kernel sweep found fastest at
# this batch, when the sweep ran), only_tuned (skipped when that is the defaults).
# Most important first. A profiled run adds one run under JAX's
# profiler: the GPU-busy share and the time by kernel (benchmarks/common/gpu_profile.py).
RUNS = [
    ("decode_kernel_check", 2, "check", {}),
    # The train step's loss and gradients with cuDNN's attention against the einsum path and
    # a float32 reference (issue 34's correctness target; passed on the H100, 2026-11-28).
    ("attention_check", 1, "attn", {}),
    # The 1.7B target: remat keeping only the attention kernel's output and statistics
    # (36.3% MFU on the H100, 2026-11-28), remat full (35.3%), its baseline in the same
    # call, and remat full with cuBLAS for every GEMM (issue item 5: on the 0.6B step
    # cuBLAS took 0.977x the time; whether the project sets it waits on this run and the
    # decode one below). They run while the decode runs' checkpoint is written in the
    # background (`CheckpointWriter`: 45-52 s on the device in 2026-11).
    ("train_1p7b_16x4096_cudnn_context", 3, "train",
     dict(preset="qwen3_1p7b", prompts=4, gens=4, seq_len=4096, attention="cudnn",
          remat="context", profile=True)),
    ("train_1p7b_16x4096_cudnn_full", 7, "train",
     dict(preset="qwen3_1p7b", prompts=4, gens=4, seq_len=4096, attention="cudnn")),
    ("train_1p7b_16x4096_cudnn_full_cublas", 5, "train",
     dict(preset="qwen3_1p7b", prompts=4, gens=4, seq_len=4096, attention="cudnn",
          xla_flags=CUBLAS_GEMM)),
    # The batch-256 decode target also measures transformers on the same GPU (item 7's 5x).
    ("decode_b256_triton", 2, "sampler", dict(batch=256, decode="triton", profile=True,
                                              hf=True)),
    # The same with cuBLAS for the layer matmuls (M = 256; item 5), and without XLA's
    # command buffers (item 4: the GPU was idle 3.1% of a decode step, 2026-11-28).
    ("decode_b256_triton_cublas", 5, "sampler",
     dict(batch=256, decode="triton", xla_flags=CUBLAS_GEMM)),
    ("decode_b256_triton_no_command_buffers", 4, "sampler",
     dict(batch=256, decode="triton", xla_flags=NO_COMMAND_BUFFERS)),
    # 42.3% of the roofline on the H100 (2026-11-28): the second decode target.
    ("decode_b64_triton", 2, "sampler", dict(batch=64, decode="triton")),
    # 28.8% MFU on the H100 (2026-11-28): met; measured again for the record.
    ("train_0p6b_32x2048_cudnn_full", 7, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="cudnn",
          profile=True)),
    # The kernel's block sizes, warps, stages and split target timed beside its defaults
    # (the fastest or within noise on the H100, 2026-11-28); then decode at batch 256 with
    # the fastest end to end, where that is not the defaults.
    ("decode_kernel_sweep", 2, "check", dict(sweep=True)),
    ("decode_b256_triton_tuned", 2, "sampler",
     dict(batch=256, decode="triton", tuned=True, only_tuned=True)),
    # Remat keeping the attention block's outputs, at 2 micro-batches (52.6 GiB predicted;
    # 72.4 at one, and remat dots 103-172 GiB, do not fit an H100): x1.25 compiled FLOPs
    # against remat full's x1.35, the same kernel-by-kernel bound (gpu_plan.py).
    ("train_1p7b_16x4096_cudnn_attention", 3, "train",
     dict(preset="qwen3_1p7b", prompts=4, gens=4, seq_len=4096, attention="cudnn",
          remat="attention")),
    ("train_0p6b_32x2048_cudnn_full_cublas", 5, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="cudnn",
          xla_flags=CUBLAS_GEMM)),
    ("decode_b256_gather", 2, "sampler", dict(batch=256, decode="gather", profile=True)),
    ("decode_b64_gather", 2, "sampler", dict(batch=64, decode="gather")),
    ("train_0p6b_32x2048_cudnn_dots", 3, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="cudnn",
          remat="dots")),
    ("train_0p6b_32x2048_cudnn_attention", 3, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="cudnn",
          remat="attention")),
    ("train_0p6b_32x2048_cudnn_full_chunk2048", 3, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="cudnn",
          logits_chunk=2048)),
    # Measured on the H100 (2026-11-27): 1.002x the step without it. Last but the baselines.
    ("train_0p6b_32x2048_cudnn_full_lhs", 5, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="cudnn",
          xla_flags=LHS)),
    ("train_0p6b_32x2048_einsum_full", 1, "train",
     dict(preset="qwen3_0p6b", prompts=4, gens=8, seq_len=2048, attention="einsum")),
    ("train_1p7b_16x4096_einsum_full", 1, "train",
     dict(preset="qwen3_1p7b", prompts=4, gens=4, seq_len=4096, attention="einsum")),
    # Item 6: the CPU demo as a user runs it, on one GPU (colocated by itself since the H200
    # run, where it needed mesh.colocated=true by hand; never run on a GPU since). Last: a
    # second device call runs it with --only demo.
    ("demo_cpu_tiny", 6, "demo", {}),
]
SUITES = {"kernels": RUNS, "loop": LOOP_RUNS}  # loop_suite.py: issue 62's
BENCHES = {"train": "train_step_bench", "sampler": "sampler_bench",
           "check": "paged_decode_check", "attn": "train_attention_check", "demo": DEMO_BENCH,
           "loop": "rl_loop_bench", "rl": RL_BENCH}
TIMEOUT_S = {"train_1p7b": 200.0, "train": 130.0, "sampler": 120.0, "check": 90.0,
             "attn": 120.0, "sweep": 180.0, "demo": 240.0}


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(RESULTS, "gpu"))
  p.add_argument("--commit", default=os.environ.get("GIT_COMMIT"),
                 help="the commit measured (default $GIT_COMMIT, else git rev-parse HEAD)")
  p.add_argument("--suite", choices=sorted(SUITES), default="kernels",
                 help="kernels: issue 34's runs (the default); loop: issue 62's")
  p.add_argument("--only", default=None,
                 help="'train', 'sampler', or comma-separated run names (prefixes match)")
  p.add_argument("--budget-s", type=float, default=400.0,
                 help="no run starts after this many seconds (the suite's own limit)")
  p.add_argument("--deadline-s", type=float, default=470.0,
                 help="a run still going this long after the suite started is killed")
  p.add_argument("--dry-run", action="store_true", help="print the runs and exit")
  p.add_argument("--gpu-memory-mib", type=int, default=None,
                 help="with --dry-run: size the train runs for a GPU of this much memory "
                      "(an H100: 81559, an H200: 143771)")
  p.add_argument("--cpu-smoke", action="store_true",
                 help="every run at tiny shapes on CPU (no budget), to check none crashes")
  p.add_argument("--sweep-from", default=None, metavar="GPU_SUITE_JSON",
                 help="the kernel sweep of an earlier call (its gpu_suite.json, copied into "
                      "the tree) for the tuned decode runs, when this call does not sweep")
  args = p.parse_args(argv)
  args.earlier = []
  if args.sweep_from:
    try:
      with open(args.sweep_from, encoding="utf-8") as f:
        args.earlier = [r for r in json.load(f)["runs"] if r.get("name") == "decode_kernel_sweep"
                        and r.get("rc") == 0 and (r.get("report") or {}).get("sweep")]
    except (OSError, ValueError, KeyError, TypeError) as e:
      p.error(f"--sweep-from {args.sweep_from}: {type(e).__name__}: {e}")
    if not args.earlier:
      p.error(f"--sweep-from {args.sweep_from}: no finished kernel sweep in it")
  if args.only:
    names = [x for x in args.only.split(",") if x]
    known = [r[0] for r in SUITES[args.suite]] + list(BENCHES)
    bad = [x for x in names if not any(k.startswith(x) for k in known)]
    if bad:
      p.error(f"--only: {', '.join(bad)} matches no run (runs: {', '.join(known)})")
    args.only = names
  return args


def gpu_info() -> tuple[str, int | None]:
  """(name, memory MiB) from nvidia-smi: never initialise JAX in this process (it would take
  the GPU's memory from the runs)."""
  try:
    line = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.splitlines()[0]
    name, mib = (x.strip() for x in line.split(","))
    return name, int(float(mib))
  except (OSError, subprocess.SubprocessError, IndexError, ValueError):
    return "unknown (no nvidia-smi)", None


def commit_of(given: str | None) -> str:
  if given:
    return given
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown (no .git; pass GIT_COMMIT)"


def version(name: str) -> str:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def train_argv(o: dict, micro: int, smoke: bool) -> list[str]:
  if smoke:  # tiny shapes; cuDNN does not run on CPU
    shape = ["--preset", "tiny_qwen3", "--seq-len", "64", "--prompts", "2", "--generations",
             "2", "--steps", "1", "--matmul-size", "256",
             "--logits-chunk", str(min(o.get("logits_chunk", 512), 64)), "--dtype", "float32",
             "--attention", "auto" if o["attention"] == "cudnn" else o["attention"]]
  else:
    shape = ["--preset", o["preset"], "--seq-len", str(o["seq_len"]), "--prompts",
             str(o["prompts"]), "--generations", str(o["gens"]), "--steps", "3",
             "--matmul-size", "8192", "--logits-chunk", str(o.get("logits_chunk", 512)),
             "--micro-batches", str(micro), "--dtype", "bfloat16", "--param-dtype", "bfloat16",
             "--attention", o["attention"]]
  return ["benchmarks/train/train_step_bench.py", *shape, "--remat", o.get("remat", "full"),
          "--matmul-dtype", "bfloat16", *(["--profile"] if o.get("profile") else []), "--json"]


def sampler_argv(o: dict, checkpoint: str, smoke: bool) -> list[str]:
  if smoke:  # sampler_bench writes its own tiny random Qwen3
    shape = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
             "--intermediate", "128", "--vocab", "512", "--batch", "4", "--prompt-len", "8",
             "--new-tokens", "8", "--chunk", "4", "--dtype", "float32"]
  else:
    shape = ["--model", checkpoint, "--dtype", "bfloat16", "--batch", str(o["batch"]),
             "--prompt-len", "128", "--new-tokens", "512"]
  return ["benchmarks/sampler/sampler_bench.py", *shape, "--repeats", "1", "--skip-mixed",
          "--skip-floor",
          "--decode-attention", o["decode"], *(["--profile"] if o.get("profile") else []),
          *([] if o.get("hf") else ["--skip-hf"]), "--json"]


def demo_argv(out_dir: str, smoke: bool) -> list[str]:
  """`jaxrl-scale train configs/cpu_tiny.yaml` as the README gives it, into a fresh
  `out_dir` (a left-over one would resume); the smoke run stops after 2 SFT and 2 RL steps."""
  short = ["run.steps=2", "sft.steps=2", "run.sft_stop_pass_rate=null",
           "data.num_validation=16"] if smoke else []
  return ["-m", "jaxrl_scale.cli", "train", os.path.join(ROOT, "configs", "cpu_tiny.yaml"),
          *short, "--output-dir", out_dir]


TUNED_KEYS = ("kv_tokens_per_block", "num_warps", "num_stages", "target_programs")


def tuned(run: dict, results: list[dict]) -> dict | None:
  """For a run with `tuned`: the fastest block configuration at its batch in the kernel
  sweep among `results` (None when the sweep did not run, failed or has none, and when it
  is the defaults, which the sweep reports: the run would repeat an untuned one)."""
  if not run.get("tuned"):
    return None
  sweep = next((r.get("report") or {} for r in results
                if r["name"] == "decode_kernel_sweep" and r.get("rc") == 0), {}).get("sweep")
  row = ((sweep or {}).get("best") or {}).get(str(run["batch"]))
  if not row:
    return None
  config = {k: int(row[k]) for k in TUNED_KEYS if k in row}
  defaults = (sweep or {}).get("defaults") or {}
  if config == {k: int(defaults[k]) for k in TUNED_KEYS if k in defaults}:
    return None
  return config


TRAIN_MEM_FRACTION = 0.9
MARGIN = 1.2  # the estimate without a GPU came out up to 20% low (docs/gpu.md)


def planned_rows(gpu_mib: int | None) -> dict[tuple[str, int], dict]:
  """{(run, micro-batches): gpu_plan.py's row} from its file for this GPU's size; empty when
  there is none (or no GPU size)."""
  if gpu_mib is None:
    return {}
  path = os.path.join(RESULTS,
                      f"gpu_plan_{'h100' if gpu_mib < 100 * 1024 else 'h200'}.json")
  try:
    with open(path, encoding="utf-8") as f:
      rows = json.load(f)["runs"]
  except (OSError, ValueError, KeyError):
    return {}
  return {(r["run"], r["micro_batches"]): r for r in rows
          if r.get("micro_batches") and r.get("hbm_bytes_per_chip")}


def predictions(gpu_mib: int | None) -> dict[tuple[str, int], float]:
  """{(run, micro-batches): predicted bytes per GPU} (`planned_rows`)."""
  return {k: float(r["hbm_bytes_per_chip"]) for k, r in planned_rows(gpu_mib).items()}


def prediction_of(row: dict | None) -> dict | None:
  """What the plan said of a train run, to set beside what the GPU measured: temporaries
  (GiB) and the roofline bounds (s), the whole program's and kernel by kernel (ms by family)."""
  if not row:
    return None
  out = {"temp_gib": round(row["temporaries_bytes_per_chip"] / 2**30, 2)
         if row.get("temporaries_bytes_per_chip") else None}
  for key in ("bound_seconds", "kernel_bound_seconds"):
    if row.get(key):
      out[key] = round(row[key], 4)
  if row.get("xla_rematerialized") is not None:
    out["xla_rematerialized"] = row["xla_rematerialized"]
  if row.get("kernel_bound_seconds_by_family"):
    out["kernel_bound_ms_by_family"] = {
        f: round(t * 1e3, 3) for f, t in row["kernel_bound_seconds_by_family"].items()}
  return out


def train_size(name: str, big: bool, gpu_mib: int | None,
               predicted: dict[tuple[str, int], float]) -> tuple[int, str | None]:
  """(micro-batches, None) for a train run, or (1, why) when it is predicted not to fit."""
  if gpu_mib is None:
    return 1, None
  usable = TRAIN_MEM_FRACTION * gpu_mib * 2**20
  known = {m: b for (n, m), b in predicted.items() if n == name}
  if not known:  # no prediction: the 1.7B runs split below 100 GiB, as before the plans
    return (2 if big and gpu_mib < 100 * 1024 else 1), None
  for micro in sorted(known):
    if known[micro] * MARGIN <= usable:
      return micro, None
  least = min(known.values())
  return 1, (f"predicted {least / 2**30:.1f} GiB per GPU (gpu_plan.py), more than "
             f"{usable / 2**30:.1f} GiB / {MARGIN}")


def plan(gpu_mib: int | None, checkpoint: str, smoke: bool = False,
         only: list[str] | None = None, tokens_dir: str = ".",
         predicted: dict[tuple[str, int], float] | None = None,
         suite: str = "kernels") -> list[dict]:
  """The runs, in order: {name, item, bench, argv, env, timeout_s, and the options}.
  Decode runs save their greedy tokens under `tokens_dir` (tokens_NAME.npy). Train runs are
  sized by `predicted` (default: `predictions(gpu_mib)`); one predicted not to fit carries
  `skip` (why)."""
  rows = planned_rows(gpu_mib) if predicted is None else {}
  predicted = ({k: float(r["hbm_bytes_per_chip"]) for k, r in rows.items()}
               if predicted is None else predicted)
  runs = []
  for name, item, bench, o in SUITES[suite]:
    if only and not any(name.startswith(x) or bench == x for x in only):
      continue
    run = dict(name=name, item=item, bench=BENCHES[bench], **o)
    if bench in ("loop", "rl"):
      loop_suite.fill(run, bench, o, smoke, tokens_dir)
    elif bench == "check":
      run["argv"] = ["benchmarks/gpu/paged_decode_check.py", *(["--quick"] if smoke else []),
                     *(["--sweep"] if o.get("sweep") else []), "--json"]
      run["timeout_s"] = TIMEOUT_S["sweep" if o.get("sweep") else "check"]
    elif bench == "attn":
      run["argv"] = ["benchmarks/gpu/train_attention_check.py", *(["--quick"] if smoke else []),
                     "--json"]
      run["timeout_s"] = TIMEOUT_S["attn"]
    elif bench == "demo":
      run["out_dir"] = os.path.join(os.path.dirname(os.path.abspath(tokens_dir)),
                                    "gpu_suite_demo")
      run["argv"] = demo_argv(run["out_dir"], smoke)
      run["timeout_s"] = TIMEOUT_S["demo"]
    elif bench == "train":
      big = o["preset"] == "qwen3_1p7b"
      run["rows"] = o["prompts"] * o["gens"]
      run["micro_batches"], why = (1, None) if smoke else train_size(name, big, gpu_mib,
                                                                      predicted)
      if why:
        run["skip"] = why
      planned = prediction_of(rows.get((name, run["micro_batches"])))
      if planned and not smoke:
        run["predicted"] = planned
      run["argv"] = train_argv(o, run["micro_batches"], smoke)
      run["timeout_s"] = TIMEOUT_S["train_1p7b" if big else "train"]
    else:
      run["argv"] = sampler_argv(o, checkpoint, smoke) + [
          "--save-tokens", os.path.join(os.path.abspath(tokens_dir), f"tokens_{name}.npy")]
      run["timeout_s"] = TIMEOUT_S["sampler"] + (60.0 if o.get("hf") else 0.0)
    run["env"] = {"XLA_FLAGS": o["xla_flags"]} if o.get("xla_flags") else {}
    if bench in ("train", "loop") and not smoke:
      run["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(TRAIN_MEM_FRACTION)
    runs.append(run)
  return runs


def run_one(run: dict, log, timeout: float) -> dict:
  cmd = [sys.executable, *run["argv"]]
  # The device machine runs the tree as copied, not installed: the benches import
  # jaxrl_scale from ROOT.
  env = dict(os.environ, PYTHONUNBUFFERED="1",
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  for key, value in run["env"].items():  # appended: the caller's XLA_FLAGS stay
    env[key] = f"{env.get(key, '')} {value}".strip()
  log(f"\n=== {run['name']}: {' '.join(f'{k}={v}' for k, v in run['env'].items())} "
      f"{shlex.join(cmd)}")
  t = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)
    rc, text = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    rc = 124
    text = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
  seconds = time.perf_counter() - t
  log(text)
  result = {k: v for k, v in run.items() if k != "argv"}
  result.update(command=shlex.join(cmd), rc=rc, seconds=round(seconds, 1),
                output_tail=text[-3000:], report=last_json(text))
  if run["bench"] == "train_step_bench" and result["report"] is None:
    result["report"] = parse_train(text) or None
  if run["bench"] == "sampler_bench" and result["report"] is None:
    result["report"] = parse_sampler(text) or None
  if run["bench"] == BENCHES["demo"]:
    result["report"] = parse_demo(text) or None
  if run["bench"] == RL_BENCH:
    result["report"] = read_rl_summary(run["out_dir"])
  if run["bench"] == BENCHES["loop"] and result["report"] is None:
    result["report"] = parse_loop(text) or None
  return result


def main(argv=None) -> int:
  args = parse_args(argv)
  smoke = args.cpu_smoke
  device, gpu_mib = ("(dry run)", args.gpu_memory_mib) if args.dry_run else (
      ("cpu smoke", None) if smoke else gpu_info())
  checkpoint = os.path.join(tempfile.gettempdir(), "gpu_suite_qwen3_0p6b")
  # The greedy tokens stay beside the checkpoint, not under --out: the device tool returns
  # at most 8 files, and the summary keeps what they are for (the share of equal tokens).
  tokens_dir = os.path.join(tempfile.gettempdir(), "gpu_suite_tokens")
  runs = plan(gpu_mib, checkpoint, smoke=smoke, only=args.only, tokens_dir=tokens_dir,
              suite=args.suite)
  if args.dry_run:
    for run in runs:
      env = "".join(f"{k}={v} " for k, v in run["env"].items())
      skip = f"  [skipped: {run['skip']}]" if run.get("skip") else ""
      pred = run.get("predicted") or {}
      if pred.get("peak_gib"):
        skip += f"  [planned peak {pred['peak_gib']} GiB a GPU]"
      if pred.get("kernel_bound_seconds"):
        skip += (f"  [planned: {pred['temp_gib']} GiB temporaries, step >= "
                 f"{pred['kernel_bound_seconds']:.3g} s kernel by kernel]")
      print(f"{run['name']} (item {run['item']}): {env}{shlex.join(['python3', *run['argv']])}"
            f"{skip}")
    return 0
  if smoke:
    args.budget_s = args.deadline_s = float("inf")

  os.makedirs(args.out, exist_ok=True)
  os.makedirs(tokens_dir, exist_ok=True)
  for name in os.listdir(tokens_dir):  # an earlier suite's tokens are not this one's
    os.remove(os.path.join(tokens_dir, name))
  log_file = open(os.path.join(args.out, "gpu_suite.log"), "w")

  def log(text: str) -> None:
    print(text, flush=True)
    log_file.write(text + "\n")
    log_file.flush()

  header = dict(suite=args.suite, device=device, gpu_memory_mib=gpu_mib, jax=version("jax"),
                jaxlib=version("jaxlib"), python=sys.version.split()[0],
                packages={name: version(name) for name in PACKAGES},
                commit=commit_of(args.commit),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
  log(json.dumps(header))
  if args.sweep_from:
    log(f"the tuned decode run: the kernel sweep in {args.sweep_from}, unless this call sweeps")
  start = time.perf_counter()
  writer = None
  if not smoke and not os.path.isdir(checkpoint) and any(
      r["bench"] == "sampler_bench" and not r.get("skip") for r in runs):
    writer = CheckpointWriter(checkpoint, log)
  results: list[dict] = []
  for run in runs:
    if time.perf_counter() - start > args.budget_s:
      log(f"=== {run['name']}: skipped, past the {args.budget_s:.0f} s budget")
      result = {**{k: v for k, v in run.items() if k != "argv"}, "skipped": "budget"}
    elif run.get("skip"):
      log(f"=== {run['name']}: skipped, {run['skip']}")
      result = {**{k: v for k, v in run.items() if k != "argv"}, "skipped": run["skip"]}
    elif run["bench"] == "sampler_bench" and writer is not None and (why := writer.wait(
        args.deadline_s - (time.perf_counter() - start))):
      log(f"=== {run['name']}: skipped, {why}")
      result = {**{k: v for k, v in run.items() if k != "argv"}, "skipped": why}
    else:
      if run.get("out_dir"):  # a train run starts fresh: a left-over run directory resumes
        shutil.rmtree(run["out_dir"], ignore_errors=True)
      config = tuned(run, results + args.earlier)  # this call's sweep first
      if config:  # the kernel sweep's fastest configuration at this run's batch
        run = dict(run, triton_config=config, argv=[
            *run["argv"], "--triton-config", ",".join(f"{k}={v}" for k, v in config.items())])
      if run.get("only_tuned") and not config and not smoke:
        why = "the kernel sweep found nothing faster than the defaults, or did not run"
        log(f"=== {run['name']}: skipped, {why}")
        result = {**{k: v for k, v in run.items() if k != "argv"}, "skipped": why}
      else:
        left = args.deadline_s - (time.perf_counter() - start)
        result = run_one(run, log,
                         max(1.0, min(run["timeout_s"], left)) if not smoke else 900.0)
    results.append(result)
    _write(args.out, header, results, tokens_dir)
  if writer is not None:  # no decode run started (the budget, --only): not left running
    writer.stop()
  log(f"suite: {time.perf_counter() - start:.0f} s")
  log_file.close()
  return 0 if all(r.get("rc", 0) == 0 for r in results) else 1


def _write(out: str, header: dict, results: list[dict], tokens_dir: str) -> None:
  """gpu_suite.json and one file per bench that ran in the suite (the train commands' runs,
  the demo's and gpu_small's, are in gpu_suite.json only), rewritten after every run (at
  most 5 files with the log; the device tool returns 8)."""
  files = {"gpu_suite.json": {**header, "runs": results,
                              "summary": summary(results, tokens_dir)}}
  suite = {r[2] for r in SUITES[header.get("suite", "kernels")]}
  for bench in (BENCHES[k] for k in ("train", "sampler", "check", "loop") if k in suite):
    files[f"{bench}.json"] = {**header, "runs": [r for r in results if r["bench"] == bench]}
  for name, body in files.items():
    with open(os.path.join(out, name), "w") as f:
      json.dump(body, f, indent=1)


if __name__ == "__main__":
  sys.exit(main())
