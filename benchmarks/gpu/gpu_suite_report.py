"""Reading the GPU suite's runs (`gpu_suite.py`): the numbers of a bench's output when its
JSON line is missing, the demo's from its text, and the summary of the comparisons issue 34
asks for (and, for `--suite loop`, issue 62's loop and gpu_small numbers and targets)."""

from __future__ import annotations

import json
import os
import re

# gpu_suite's name for the demo run's "bench" (`jaxrl-scale train`, no JSON of its own).
DEMO_BENCH = "jaxrl_scale_train"
# ... and for configs/gpu_small.yaml's runs (`jaxrl-scale train`, read from summary.json).
RL_BENCH = "gpu_small"
# Issue 62's targets: a loop's efficiency, the weight update's share of a step, the 1.7B
# peak against the plan's, and gpu_small's gain within its wall time.
LOOP_EFFICIENCY_MIN = 0.85
UPDATE_SHARE_MAX = 0.02
PEAK_TOLERANCE = 0.15
GAIN_MIN, RL_WALL_MAX_S = 0.25, 360.0


def read_rl_summary(out_dir: str) -> dict | None:
  """A train run's summary.json (validation before and after RL, the RL steps' wall time)."""
  try:
    with open(os.path.join(out_dir, "summary.json"), encoding="utf-8") as f:
      s = json.load(f)
  except (OSError, ValueError):
    return None
  keys = ("start_pass_rate", "final_pass_rate", "rl_wall_s", "steps", "final_step")
  return {k: s[k] for k in keys if k in s} or None


def parse_loop(text: str) -> dict:
  """An rl_loop_bench run without its JSON line (killed at its time limit, or failed): the
  steps it finished and their seconds, and whether it ran out of device memory."""
  steps = re.findall(r"^  \w+ step (\d+): ([\d.]+) s \|", text, re.M)
  out = {"partial": True, "steps_done": len(steps),
         "step_s": [float(x) for _, x in steps]} if steps else {}
  if re.search(r"RESOURCE_EXHAUSTED|[Oo]ut of memory", text):
    out["out_of_memory"] = True
  return out


def loop_summary(run: dict) -> dict | None:
  """An rl_loop_bench run's colocated numbers, its peak memory beside the plan's, and the
  issue's targets on them."""
  mode = ((run.get("report") or {}).get("modes") or {}).get("colocated")
  if not mode or "median" not in mode:
    return None
  med = mode["median"]
  out = {k: med[k] for k in ("step_s", "generate_s", "train_s", "update_s", "score_s",
                             "wait_s", "other_s", "generated_tok_s_per_device",
                             "trained_tok_s_per_device") if k in med}
  out.update({k: mode[k] for k in ("loop_efficiency", "update_share_of_step", "train_mfu",
                                   "generate_fraction_of_roofline") if k in mode})
  out["steps_timed"] = len(mode.get("steps", [])) - int(run["report"].get("warmup", 0))
  peak = mode.get("peak_bytes_after")
  if peak:
    out["peak_gib"] = round(max(peak.values()) / 2**30, 2)
  pred = run.get("predicted")
  if pred and out.get("peak_gib"):
    out["planned_peak_gib"] = pred["peak_gib"]
    out["peak_over_plan"] = round(out["peak_gib"] / pred["peak_gib"], 3)
  targets = {}
  if "loop_efficiency" in out:
    targets[f"loop efficiency >= {LOOP_EFFICIENCY_MIN}"] = (
        out["loop_efficiency"] >= LOOP_EFFICIENCY_MIN)
  if "update_share_of_step" in out:
    targets[f"weight update <= {UPDATE_SHARE_MAX:.0%} of a step"] = (
        out["update_share_of_step"] <= UPDATE_SHARE_MAX)
  if "peak_over_plan" in out:
    targets[f"peak within {PEAK_TOLERANCE:.0%} of the plan's"] = (
        abs(out["peak_over_plan"] - 1.0) <= PEAK_TOLERANCE)
  out["targets"] = targets
  return out


def rl_summary(run: dict) -> dict:
  """A gpu_small run: its exit, the whole command's seconds, the gain after the warm start."""
  out = {"rc": run.get("rc"), "seconds": run.get("seconds"), **(run.get("report") or {})}
  if out.get("start_pass_rate") is not None and out.get("final_pass_rate") is not None:
    out["gain"] = round(out["final_pass_rate"] - out["start_pass_rate"], 4)
    out["targets"] = {
        f"validation +{GAIN_MIN} or more": out["gain"] >= GAIN_MIN,
        f"whole command <= {RL_WALL_MAX_S:.0f} s": (out["seconds"] or 0) <= RL_WALL_MAX_S}
  return out


def parse_demo(text: str) -> dict:
  """The demo's numbers from its output: where the roles ran, the validation pass rate
  before and after RL, its RL time."""
  out = {}
  m = re.search(r"^  mode (\S+) \| (\S+) (.*)$", text, re.M)
  if m:
    out.update(mode=m.group(1), backend=m.group(2), devices=m.group(3).strip(),
               colocated=m.group(3).startswith("colocated"))
  m = re.search(r"validation pass rate: (?:([\d.]+) at step 0[^>]*-> )?([\d.]+) at step (\d+)",
                text)
  if m:
    out.update(final_pass_rate=float(m.group(2)), final_step=int(m.group(3)))
    if m.group(1):
      out["start_pass_rate"] = float(m.group(1))
  m = re.search(r"^time: (.*?) of RL steps", text, re.M)
  if m:
    out["rl_time"] = m.group(1)
  return out


def parse_train(text: str) -> dict:
  """Numbers of train_step_bench's text report (when its JSON line is missing)."""
  out = {}
  patterns = {"params_m": r"model: \S+, ([\d.]+)M params",
              "compile_s": r"compile ([\d.]+) s",
              "temp_gib": r"temporaries ([\d.]+) GiB",
              "model_tflop_per_step": r"model FLOPs per step: ([\d.]+) TFLOP",
              "median_step_s": r"median step ([\d.]+) s",
              "gflop_s": r"train step: ([\d.]+) GFLOP/s",
              "matmul_peak_gflop_s": r"matmul peak \(\d+\^2\): ([\d.]+) GFLOP/s"}
  for key, pattern in patterns.items():
    m = re.search(pattern, text)
    if m:
      out[key] = float(m.group(1))
  return out


def parse_sampler(text: str) -> dict:
  """A sampler_bench run's own numbers from its log when its JSON line is missing (killed at
  its time limit, e.g. while transformers generated): the best of its timed runs so far."""
  runs = re.findall(r"^\[decode\] ours, run \d+: (\d+) tokens/s(?: \(([\d.]+)% of the HBM "
                    r"roofline\))?", text, re.M)
  if not runs:
    return {}
  best = max(runs, key=lambda r: int(r[0]))
  out = {"ours_tok_s": float(best[0]), "partial": True}
  if best[1]:
    out["fraction_of_roofline"] = round(float(best[1]) / 100, 4)
  return out


def last_json(text: str) -> dict | None:
  line = next((x for x in reversed(text.splitlines()) if x.startswith("{")), None)
  try:
    return json.loads(line) if line else None
  except json.JSONDecodeError:
    return None


def summary(runs: list[dict], out_dir: str | None = None) -> dict:
  """The comparisons the issue asks for, from whatever ran: the decode kernel's accuracy and
  read bandwidth beside the gather's, its fastest block configuration per batch; decode
  kernel vs gather per batch (tok/s, roofline, and with `out_dir` the share of equal greedy
  tokens), each train variant's MFU and step time against its shape's cuDNN remat-full run."""
  # Runs that ended well, and decode runs killed after their own timed runs (their numbers
  # so far, marked partial: `parse_sampler`).
  by = {r["name"]: r.get("report") or {} for r in runs
        if r.get("rc") == 0 or (r.get("report") or {}).get("partial")}
  planned = {r["name"]: r["predicted"] for r in runs if r.get("predicted")}
  out = {}
  check = by.get("decode_kernel_check", {}).get("bfloat16")
  if check:
    out["decode_kernel_bf16"] = {k: check[k] for k in (
        "triton_vs_gather", "triton_vs_f32", "triton_us", "gather_us", "triton", "gather")
        if k in check}
  # The train step's loss and gradients with cuDNN's attention (exit 1 when outside the
  # tolerance: read whatever its report says, from any exit).
  attn = next((r.get("report") for r in runs if r["name"] == "attention_check"
               and r.get("report")), None)
  if attn:
    out["train_attention"] = {k: attn[k] for k in (
        "passed", "kernel", "ways", "cudnn_vs_einsum", "tolerance", "reference_loss")
        if k in attn}
  swept = by.get("decode_kernel_sweep", {}).get("sweep")
  if swept:
    out["decode_kernel_sweep"] = dict(defaults=swept.get("defaults"), best=swept.get("best"),
                                      errors=sum("error" in r for r in swept.get("runs", [])))
  for batch in (64, 256):
    kernel, gather = by.get(f"decode_b{batch}_triton"), by.get(f"decode_b{batch}_gather")
    if kernel and kernel.get("hf_tok_s"):
      # transformers' generate on the same device (sampler_bench's hf_device): item 7's ratio.
      out[f"decode_b{batch}_vs_transformers"] = {k: kernel[k] for k in (
          "ours_tok_s", "hf_tok_s", "ratio", "hf_device", "greedy_match") if k in kernel}
    elif kernel and kernel.get("hf_error"):  # transformers failed there; ours still ran
      out[f"decode_b{batch}_vs_transformers"] = {k: kernel[k] for k in (
          "hf_error", "hf_device") if k in kernel}
    if kernel and gather and gather.get("ours_tok_s"):
      out[f"decode_b{batch}"] = dict(
          triton_tok_s=kernel.get("ours_tok_s"), gather_tok_s=gather.get("ours_tok_s"),
          triton_over_gather=round(kernel["ours_tok_s"] / gather["ours_tok_s"], 3),
          triton_fraction_of_roofline=kernel.get("fraction_of_roofline"),
          gather_fraction_of_roofline=gather.get("fraction_of_roofline"))
      for impl, rep in (("triton", kernel), ("gather", gather)):
        for key in ("gpu_busy_fraction", "family_ms_per_step"):
          if key in rep:
            out[f"decode_b{batch}"][f"{impl}_{key}"] = rep[key]
      match = token_match(out_dir, f"decode_b{batch}_triton", f"decode_b{batch}_gather")
      if match is not None:
        out[f"decode_b{batch}"]["greedy_tokens_equal"] = match
  for name, rep in by.items():
    # Decode variants (flags) against the kernel run of their batch.
    base = by.get("_".join(name.split("_")[:3]), {})
    if (name.startswith("decode_b") and name.count("_") > 2 and rep.get("ours_tok_s")
        and base.get("ours_tok_s") and "_triton_" in name):
      out[name] = {"ours_tok_s": rep["ours_tok_s"],
                   "fraction_of_roofline": rep.get("fraction_of_roofline"),
                   "over_triton": round(rep["ours_tok_s"] / base["ours_tok_s"], 3)}
      if rep.get("triton"):
        out[name]["triton"] = rep["triton"]
  for r in runs:  # issue 62 (gpu_suite.py --suite loop)
    if r.get("bench") == "rl_loop_bench" and r.get("rc") == 0 and (loop := loop_summary(r)):
      out[r["name"]] = loop
    elif r.get("bench") == "rl_loop_bench" and "rc" in r:
      out[r["name"]] = {"rc": r["rc"], "seconds": r.get("seconds"),
                        **{k: v for k, v in (r.get("report") or {}).items()
                           if k in ("steps_done", "step_s", "out_of_memory")}}
    if r.get("bench") == RL_BENCH and "rc" in r:
      out[r["name"]] = rl_summary(r)
  demo = next((r for r in runs if r.get("bench") == DEMO_BENCH and "rc" in r), None)
  if demo:  # item 6: the README's demo command on this GPU, whatever its exit
    out["demo"] = dict(rc=demo["rc"], seconds=demo.get("seconds"), **(demo.get("report") or {}))
  for name, rep in by.items():
    if not name.startswith("train_") or "median_step_s" not in rep:
      continue
    base = by.get("_".join(name.split("_")[:3]) + "_cudnn_full", {})
    out[name] = {k: rep[k] for k in ("median_step_s", "temp_gib", "mfu_causal_attention",
                                     "mfu_full_attention", "fraction_of_matmul_peak",
                                     "matmul_peak_tflop_s", "gpu_busy_fraction",
                                     "family_ms_per_step", "xla_rematerialized") if k in rep}
    if base.get("median_step_s"):
      out[name]["step_over_cudnn_full"] = round(rep["median_step_s"] / base["median_step_s"], 3)
    pred = planned.get(name)
    if pred:
      # The plan's numbers (gpu_plan.py, no GPU) beside the device's: how far the kernels
      # run from their rooflines, and how close the memory estimate came.
      out[name]["predicted"] = pred
      if pred.get("kernel_bound_seconds"):
        out[name]["step_over_kernel_bound"] = round(
            rep["median_step_s"] / pred["kernel_bound_seconds"], 3)
      # Per family where the step was profiled: which kernels run far from their rooflines.
      fam, bound = rep.get("family_ms_per_step") or {}, pred.get("kernel_bound_ms_by_family") or {}
      ratios = {f: round(fam[f] / bound[f], 3) for f in bound if bound[f] > 0 and f in fam}
      if ratios:
        out[name]["family_over_kernel_bound"] = ratios
  return out


def token_match(out_dir: str | None, a: str, b: str) -> float | None:
  """Share of equal tokens, position by position, of two decode runs' saved greedy tokens
  (bfloat16 rounding differs between the paths, so a near tie may flip and the rows then
  diverge: expect most, not all, on a random model)."""
  if out_dir is None:
    return None
  paths = [os.path.join(out_dir, f"tokens_{x}.npy") for x in (a, b)]
  if not all(os.path.exists(p) for p in paths):
    return None
  import numpy as np

  ta, tb = (np.load(p) for p in paths)
  return round(float(np.mean(ta == tb)), 5) if ta.shape == tb.shape else None
