"""The GPU measurements of issue 34 in one run: einsum vs cuDNN attention, same machine.

    GIT_COMMIT=$(git rev-parse HEAD) python3 benchmarks/gpu_suite.py      # on the GPU
    python benchmarks/gpu_suite.py --dry-run                              # the plan, anywhere

Runs each in its own process (one holds the GPU at a time), each with `--attention einsum`
and then `--attention cudnn`; the 1.7B train step and decode at batch 256 go first:

1. train_step_bench: qwen3_1p7b, 16 x 4096 tokens, remat full; qwen3_0p6b, 32 x 2048
   (compile, one warm-up step, 3 timed steps), bfloat16 activations over the presets'
   float32 masters (cuDNN takes bf16 only; the presets alone compute in float32, as the
   issue's H200 numbers did).
2. sampler_bench: a random Qwen3-0.6B-shaped checkpoint (hidden 1024, 28 layers, 16 heads
   of 128, 8 kv heads, MLP 3072, vocab 151936, tied; written once with transformers, in
   bfloat16), bf16, 128 prompt + 512 new tokens, batch 64 and 256, --skip-hf (the baseline
   runs transformers on CPU) and --skip-mixed.

Writes to --out (default $OUT, else benchmarks/results/gpu): train_step_bench.json and
sampler_bench.json, each {device, gpu_memory_mib, jax, jaxlib, commit, runs: [...]} with
every run's command, exit code, seconds, parsed numbers and output tail; and gpu_suite.log,
all output. The train step's MFU is against the chip's bf16 dense spec peak (`SPEC_BF16`),
with the model FLOPs counted as train_step_bench does (full S x S attention) and with
causal attention (half of it, as MaxText counts), both given.

The device machine's working tree has no .git: pass the commit as GIT_COMMIT. On a GPU of
less than 100 GiB the 1.7B run takes 2 micro-batches (55.7 GiB of einsum temporaries were
measured at one on an H200), both attention paths alike. The whole suite is sized for under
8 minutes; a run that would start after --budget-s is skipped and says so.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# bf16 dense tensor-core peak (TFLOP/s) by device name, from NVIDIA's datasheets (SXM).
SPEC_BF16 = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}

QWEN3_0P6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                  rope_theta=1000000.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# (name, preset, prompts, generations, seq_len): rows = prompts x generations.
TRAIN_SHAPES = [("qwen3_1p7b_16x4096", "qwen3_1p7b", 4, 4, 4096),
                ("qwen3_0p6b_32x2048", "qwen3_0p6b", 4, 8, 2048)]
SAMPLER_BATCHES = [64, 256]
IMPLS = ("einsum", "cudnn")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(HERE, "results", "gpu"))
  p.add_argument("--commit", default=os.environ.get("GIT_COMMIT"),
                 help="the commit measured (default $GIT_COMMIT, else git rev-parse HEAD)")
  p.add_argument("--impls", default=",".join(IMPLS), help="attention impls, comma-separated")
  p.add_argument("--only", choices=("train", "sampler"), default=None)
  p.add_argument("--budget-s", type=float, default=450.0,
                 help="no run starts after this many seconds (the suite's own limit)")
  p.add_argument("--run-timeout-s", type=float, default=240.0, help="limit of one run")
  p.add_argument("--deadline-s", type=float, default=540.0,
                 help="a run still going this long after the suite started is killed")
  p.add_argument("--dry-run", action="store_true", help="print the runs and exit")
  args = p.parse_args(argv)
  args.impls = [x for x in args.impls.split(",") if x]
  bad = [x for x in args.impls if x not in ("auto", "einsum", "cudnn")]
  if bad:
    p.error(f"--impls: {', '.join(bad)} not among auto, einsum, cudnn")
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


def train_runs(impls, gpu_mib) -> list[dict]:
  runs = []
  for name, preset, prompts, gens, seq in TRAIN_SHAPES:
    micro = 2 if preset == "qwen3_1p7b" and gpu_mib is not None and gpu_mib < 100 * 1024 else 1
    for impl in impls:
      runs.append(dict(bench="train_step_bench", name=f"{name}_{impl}", attention=impl,
                       preset=preset, rows=prompts * gens, seq_len=seq, micro_batches=micro,
                       argv=["train_step_bench.py", "--preset", preset, "--seq-len", str(seq),
                             "--prompts", str(prompts), "--generations", str(gens),
                             "--remat", "full", "--steps", "3", "--matmul-size", "8192",
                             "--micro-batches", str(micro), "--dtype", "bfloat16",
                             "--attention", impl]))
  return runs


def sampler_runs(impls, checkpoint: str) -> list[dict]:
  return [dict(bench="sampler_bench", name=f"qwen3_0p6b_b{batch}_{impl}", attention=impl,
               batch=batch,
               argv=["sampler_bench.py", "--model", checkpoint, "--dtype", "bfloat16",
                     "--batch", str(batch), "--prompt-len", "128", "--new-tokens", "512",
                     "--repeats", "2", "--skip-hf", "--skip-mixed", "--json",
                     "--attention", impl])
          for batch in SAMPLER_BATCHES for impl in impls]


def parse_train(text: str) -> dict:
  """Numbers of train_step_bench's report (it prints text, no JSON)."""
  out = {}
  patterns = {"params_m": r"model: \S+, ([\d.]+)M params",
              "compile_s": r"compile ([\d.]+) s",
              "temp_gib": r"temporaries ([\d.]+) GiB",
              "model_tflop_per_step": r"model FLOPs per step: ([\d.]+) TFLOP",
              "median_step_s": r"median step ([\d.]+) s",
              "gflop_s": r"train step: ([\d.]+) GFLOP/s",
              "fp32_matmul_peak_gflop_s": r"matmul peak \(\d+\^2\): ([\d.]+) GFLOP/s"}
  for key, pattern in patterns.items():
    m = re.search(pattern, text)
    if m:
      out[key] = float(m.group(1))
  return out


def mfu(run: dict, parsed: dict, device: str) -> dict:
  """MFU against the bf16 spec peak, with full and with causal (halved) attention FLOPs."""
  if "median_step_s" not in parsed or "model_tflop_per_step" not in parsed:
    return {}
  sys.path.insert(0, ROOT)
  from jaxrl_scale.models import config as model_config  # no JAX computation: a dataclass

  cfg = model_config.preset(run["preset"])
  tokens = run["rows"] * run["seq_len"]
  attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * run["seq_len"] * tokens
  full = parsed["model_tflop_per_step"] * 1e12
  causal = full - attention / 2
  peak = next((v for k, v in SPEC_BF16.items() if k in device), None)
  out = {"tflop_s_full_attention": full / parsed["median_step_s"] / 1e12,
         "tflop_s_causal_attention": causal / parsed["median_step_s"] / 1e12}
  if peak:
    out.update(spec_bf16_tflop_s=peak, mfu_full_attention=out["tflop_s_full_attention"] / peak,
               mfu_causal_attention=out["tflop_s_causal_attention"] / peak)
  return out


def write_checkpoint(path: str) -> None:
  import torch
  import transformers

  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(**QWEN3_0P6B)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
  model.save_pretrained(path)


def run_one(run: dict, args, log, timeout: float) -> dict:
  cmd = [sys.executable, *run["argv"]]
  log(f"\n=== {run['name']}: {shlex.join(cmd)}")
  t = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    rc, text = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    rc = 124
    text = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
  seconds = time.perf_counter() - t
  log(text)
  result = {k: v for k, v in run.items() if k != "argv"}
  result.update(command=shlex.join(cmd), rc=rc, seconds=round(seconds, 1),
                output_tail=text[-3000:])
  if run["bench"] == "train_step_bench":
    result.update(parse_train(text))
  else:
    line = next((x for x in reversed(text.splitlines()) if x.startswith("{")), None)
    result["report"] = json.loads(line) if line else None
  return result


def main(argv=None) -> int:
  args = parse_args(argv)
  device, gpu_mib = gpu_info() if not args.dry_run else ("(dry run)", None)
  checkpoint = os.path.join(tempfile.gettempdir(), "gpu_suite_qwen3_0p6b")
  train = train_runs(args.impls, gpu_mib) if args.only in (None, "train") else []
  sampler = sampler_runs(args.impls, checkpoint) if args.only in (None, "sampler") else []
  # The headline shapes first (the 1.7B train step, decode at batch 256), so that a
  # budget cut drops the secondary ones.
  n = len(args.impls)
  runs = train[:n] + sampler[n:] + train[n:] + sampler[:n]
  if args.dry_run:
    for run in runs:
      print(f"{run['name']}: {shlex.join(['python3', *run['argv']])}")
    return 0

  os.makedirs(args.out, exist_ok=True)
  log_file = open(os.path.join(args.out, "gpu_suite.log"), "w")

  def log(text: str) -> None:
    print(text, flush=True)
    log_file.write(text + "\n")
    log_file.flush()

  header = dict(device=device, gpu_memory_mib=gpu_mib, jax=version("jax"),
                jaxlib=version("jaxlib"), commit=commit_of(args.commit),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
  log(json.dumps(header))
  start = time.perf_counter()
  results: dict[str, list] = {"train_step_bench": [], "sampler_bench": []}
  for run in runs:
    if time.perf_counter() - start > args.budget_s:
      log(f"=== {run['name']}: skipped, past the {args.budget_s:.0f} s budget")
      result = {**{k: v for k, v in run.items() if k != "argv"}, "skipped": "budget"}
    else:
      if run["bench"] == "sampler_bench" and not os.path.isdir(checkpoint):
        t = time.perf_counter()
        write_checkpoint(checkpoint)
        log(f"=== wrote the Qwen3-0.6B-shaped checkpoint in {time.perf_counter() - t:.1f} s")
      left = args.deadline_s - (time.perf_counter() - start)
      result = run_one(run, args, log, max(1.0, min(args.run_timeout_s, left)))
      if run["bench"] == "train_step_bench":
        result.update(mfu(run, result, device))
    results[run["bench"]].append(result)
    for bench, rows in results.items():  # rewritten after every run: a kill keeps the rest
      if rows:
        with open(os.path.join(args.out, f"{bench}.json"), "w") as f:
          json.dump({**header, "runs": rows}, f, indent=1)
  log(f"suite: {time.perf_counter() - start:.0f} s")
  log_file.close()
  return 0 if all(r.get("rc", 0) == 0 for rows in results.values() for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
