"""The whole RL loop side by side: our `jaxrl-scale train` against Tunix's GRPOLearner and
TRL's GRPOTrainer, on one task, for a fixed number of steps (issue 66's third comparison).

    python benchmarks/peers/loop_compare.py                       # 12 steps x 16 x 8, 2 rounds
    python benchmarks/peers/loop_compare.py --json benchmarks/results/peers_loop_cpu_X.json
    python benchmarks/peers/loop_compare.py --quick               # 3 steps x 4 x 4, 1 round
    python benchmarks/peers/loop_compare.py --sides ours,ours_colocated,tunix

Every side gets the same checkpoint (`loop_task.py`: a warm-started small Qwen3 with a
byte-level tokenizer.json), the same prompts in the same order (`--steps` steps of
`--prompts` prompts of `arithmetic/add2`, in the order our prompt source yields them), the
same group size, completion cap, temperature, reward (our arithmetic verifier, +1 / -1)
and optimizer (AdamW: rate, eps, decay, clipping; constant, no warm-up), and runs its
library's own loop for `--steps` steps in a process of its own (`peer_loops.py`), one side
at a time, alternating ours, Tunix, TRL for `--rounds` rounds. Everything else is each
side's default (ours: configs/cpu_tiny.yaml, our config for this task on a CPU); what
differs is listed in LOOP_UNEQUAL and printed.

Reported per side: the wall time per step after the first (the first holds the compiles),
its median as steps per second and ours over theirs (`ratios`: of the medians and round by
round), the time to run all the steps, the phases each library times itself, and the
reward curve (mean reward and pass rate at every step). `ours_colocated` is our loop in
its synchronous colocated mode on one device (mesh.colocated, pipeline.mode colocated):
the same algorithm shape as the peers' (generate, then train, on-policy), not a default.
`ours_1plus1` is cpu_tiny's PipelineRL on two simulated devices, one for the trainer and
one for the generator (cpu_tiny splits 8 devices 4 + 4).

Installs nothing; a peer its Python cannot import is reported absent in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks.peers import loop_task  # noqa: E402
from benchmarks.peers import peer_loops  # noqa: E402
from benchmarks.peers import peers  # noqa: E402

LOOPS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_loops.py")
SIDES = ("ours", "ours_colocated", "ours_1plus1", "tunix", "trl")
# Our loop in its synchronous mode on one device: what the peers' loops do.
COLOCATED = ["mesh.colocated=true", "mesh.simulated_cpu_devices=1", "pipeline.mode=colocated"]
# PipelineRL as cpu_tiny.yaml runs it, on one simulated device per core of a 2-core machine:
# the trainer and the generator each on one (cpu_tiny's 4 + 4 split the step 4 ways).
SPLIT_1_1 = ["mesh.simulated_cpu_devices=2", "mesh.trainer_devices=1",
             "mesh.generator_devices=1"]
# Our sides: the overrides each adds to `peer_loops.ours_overrides`.
OURS_SETS = {"ours": [], "ours_colocated": COLOCATED, "ours_1plus1": SPLIT_1_1}

LOOP_UNEQUAL = {
    "ours": (
        "ours (configs/cpu_tiny.yaml): PipelineRL-2, generation streams on 4 simulated CPU "
        "devices while training runs on 4 others (all 8 on the same 2 cores), in-flight "
        "weight updates, so a step trains groups up to 2 policy versions old; the peers "
        "generate, then train, on-policy, on one device",
        "ours' loss and batch: CISPO (eps_max 5), prompt-average, batch-level advantage "
        "normalisation, zero-variance filter, No-Positive-Resampling (ScaleRL, our "
        "defaults); the peers' GRPO defaults below",
        "ours: continuous batching with a paged KV cache (P x G slots, decode_chunk 4, "
        "prompt bucket 8), per-token logprobs recorded by the sampler (no recompute)",
        "ours writes metrics.jsonl, TensorBoard and one checkpoint at the end (orbax, "
        "async; its time is in the last step's row as time/checkpoint_s)",
    ),
    "tunix": (
        "Tunix: GRPOLearner, loss 'grpo' (clip 0.2, sequence-mean-token-mean), group "
        "std-normalised advantages, its defaults; beta 0 (its default 0.04 needs a "
        "reference model's forward each step; ours and TRL's have no KL)",
        "Tunix colocated on one device (actor, rollout and reference share one mesh; its "
        "default, so rollout and training alternate and the model is shared, no weight "
        "sync); its vanilla rollout engine (static batch of P x G rows, dense KV cache of "
        "prompt + cap, until all rows end or the cap)",
        "Tunix's perf spans are on (PerfMetricsConfig with its from_cluster_config export): "
        "they give its phase times; off by default",
        "Tunix: temperature 1.0 (its RolloutConfig default 0.9), as ours and TRL's",
        "Tunix recomputes nothing: num_iterations 1, so its old log-probs are the current "
        "policy's (ratio 1)",
    ),
    "trl": (
        "TRL: GRPOTrainer without vLLM (transformers' generate, eager PyTorch on CPU, its "
        "default threads), loss 'dapo' (its default), group std-normalised advantages "
        "(scale_rewards 'group'), beta 0 (its default)",
        "TRL: one optimizer step per step on all P x G completions "
        "(per_device_train_batch_size P x G, gradient_accumulation_steps 1, "
        "steps_per_generation 1), shuffle_dataset off so the prompts come in our order",
        "settings moved off TRL's defaults: bf16 off (default on; ours and Tunix's run "
        "float32), gradient_checkpointing off (default on; ours remat none, Tunix none), "
        "and the optimizer of every side (constant rate 1e-5, eps 1e-15, decay 0.01; its "
        "default is linear decay from 1e-6, eps 1e-8, no decay); clipping at 1.0 is its "
        "default",
        "TRL's GRPOTrainer recomputes the completions' log-probs in a forward pass when "
        "it needs old ones; with num_iterations 1 it uses the detached current ones",
    ),
    "ours_colocated": (
        "not our default: mesh.colocated, pipeline.mode colocated, one simulated device "
        "(generate, then train, on-policy, as the peers); otherwise as 'ours'",
    ),
    "ours_1plus1": (
        "not cpu_tiny.yaml's split: 2 simulated devices, the trainer on one and the "
        "generator on the other (cpu_tiny: 8, split 4 + 4); otherwise as 'ours' "
        "(PipelineRL-2: a step trains on completions up to 2 updates old, the peers' on "
        "their current weights)",
    ),
}


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default=None,
                 help="the task's checkpoint (default: built into --cache by loop_task.py)")
  p.add_argument("--cache", default="/tmp/jaxrl_peers", help="where the checkpoint goes")
  p.add_argument("--peers-python", default=os.environ.get("JAXRL_PEERS_PYTHON",
                                                          peers.DEFAULT_PEERS_PYTHON))
  p.add_argument("--sides", default="ours,tunix,trl", help=f"comma-separated, of {SIDES}")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--prompts", type=int, default=16, help="prompts per step (P)")
  p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
  p.add_argument("--cap", type=int, default=8, help="completion cap in tokens")
  p.add_argument("--lr", type=float, default=1e-5)
  p.add_argument("--rounds", type=int, default=2, help="runs per side (alternating)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--note", default="", help="recorded in the JSON (e.g. the machine's load)")
  p.add_argument("--json", default=None, help="write the result here")
  p.add_argument("--quick", action="store_true", help="3 steps x 4 prompts x 4, one round")
  args = p.parse_args(argv)
  if args.quick:
    args.steps, args.prompts, args.group, args.rounds = 3, 4, 4, 1
  args.side_names = [x.strip() for x in args.sides.split(",") if x.strip()]
  if not args.side_names or set(args.side_names) - set(SIDES):
    p.error(f"--sides: a comma-separated subset of {','.join(SIDES)}, not {args.sides!r}")
  if min(args.steps, args.prompts, args.cap, args.rounds) < 1 or args.group < 2:
    p.error("--steps, --prompts, --cap and --rounds must be >= 1 and --group >= 2")
  return args


# ------------------------------------------------------------------------ the computations


def make_spec(args, model: str, workdir: str) -> dict:
  """What every side runs: the task, the prompts of each step in our source's order, the
  optimizer. The prompts come from our config of the run (`peer_loops.ours_overrides`)."""
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top

  spec = dict(model=model, task=loop_task.TASK, group=args.group, cap=args.cap,
              prompt_len=8, temperature=1.0, lr=args.lr, eps=1e-15, weight_decay=0.01,
              max_grad_norm=1.0, seed=args.seed, workdir=workdir,
              prompts=[[{}] * args.prompts] * args.steps)
  cfg = config_lib.load(peer_loops.BASE_CONFIG, peer_loops.ours_overrides(spec))
  spec["prompts"] = loop_task.step_prompts(cfg.data, model, args.steps, args.prompts)
  return spec


def steady(rows: list[dict]) -> list[float]:
  """Seconds of every step after the first (the first holds each side's compiles)."""
  return [r["step_s"] for r in rows[1:]] or [r["step_s"] for r in rows]


def summarize(run: dict) -> dict:
  """One side's run: its step times, the time to all steps, phase medians, reward curve."""
  rows = run["rows"]
  after = steady(rows)
  phases: dict[str, list[float]] = {}
  for r in rows[1:]:
    for k, v in r["phases"].items():
      if isinstance(v, (int, float)) and v == v:  # NaN-free
        phases.setdefault(k, []).append(v)
  return {"median_step_s": statistics.median(after), "mean_step_s": statistics.fmean(after),
          "first_step_s": rows[0]["step_s"], "all_steps_s": rows[-1]["end_s"],
          "process_s": run.get("process_s", run.get("wall_s")),
          "phases_median": {k: statistics.median(v) for k, v in phases.items()},
          "reward": [r["reward_mean"] for r in rows],
          "pass_rate": [r["pass_rate"] for r in rows],
          "length": [r["length_mean"] for r in rows]}


def same_prompts(rows: list[dict], per_step: int) -> float | None:
  """Ours only: the fraction of steps that trained exactly the groups admitted for it
  (admission numbers (s-1)P .. sP-1): in pipeline mode groups train in the order they
  finish."""
  ids = [r.get("group_ids") for r in rows]
  if not ids or any(i is None for i in ids):
    return None
  want = [list(range(k * per_step, (k + 1) * per_step)) for k in range(len(ids))]
  return sum(sorted(a) == b for a, b in zip(ids, want)) / len(ids)


def compare(runs: dict[str, list[dict]]) -> dict:
  """Ours over each other side in steps per second (1 / median step after the first),
  of the medians and round by round; and in the time to all the steps."""
  out = {}
  for base in OURS_SETS:
    if base not in runs:
      continue
    for peer in ("tunix", "trl"):
      if peer not in runs:
        continue
      mine = [1 / summarize(r)["median_step_s"] for r in runs[base]]
      theirs = [1 / summarize(r)["median_step_s"] for r in runs[peer]]
      total = [summarize(t)["all_steps_s"] / summarize(o)["all_steps_s"]
               for o, t in zip(runs[base], runs[peer])]
      out[f"{base}/{peer}"] = {"steps_per_s": peers.ratios(mine, theirs),
                               "all_steps_time": {"median": statistics.median(total),
                                                  "per_round": total}}
  return out


# ------------------------------------------------------------------------------- the run


def run_side(name: str, python: str, spec_path: str, workdir: str, log) -> dict:
  side = "ours" if name.startswith("ours") else name
  out = os.path.join(workdir, f"{name}_{time.monotonic_ns()}.json")
  err = open(os.path.join(workdir, f"{name}.log"), "a")
  env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3",
             JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  env.pop("XLA_FLAGS", None)
  start = time.perf_counter()
  proc = subprocess.run([python, LOOPS_PY, side, spec_path, out], stdout=err, stderr=err,
                        env=env, cwd=ROOT)
  err.close()
  if not os.path.isfile(out):
    raise RuntimeError(f"{name}: the loop process exited {proc.returncode} without an "
                       f"answer (its log: {err.name})")
  with open(out) as f:
    res = json.load(f)
  if not res.get("ok"):
    raise RuntimeError(f"{name}: {res.get('error')} (its log: {err.name})")
  res["process_s"] = res.get("process_s", time.perf_counter() - start)
  s = summarize(res)
  log(f"  {name}: {len(res['rows'])} steps in {s['all_steps_s']:.1f} s (first "
      f"{s['first_step_s']:.1f} s), then {s['median_step_s']:.3f} s a step = "
      f"{1 / s['median_step_s']:.2f} steps/s; pass rate by step "
      f"{' '.join(f'{x:.2f}' if x is not None else '-' for x in s['pass_rate'])}")
  return res


def versions_of(names: list[str], peers_python: str, log) -> tuple[dict, dict, dict]:
  """Each side's versions and every package of each Python (peers.Side's hello), and the
  peers that cannot run (absent, one line each)."""
  versions, packages, absent = {}, {}, {}
  for name in names:
    side = peers.Side("ours" if name.startswith("ours") else name,
                      sys.executable if name.startswith("ours") else peers_python)
    if side.absent:
      absent[name] = side.absent
      log(f"{name}: absent ({side.absent})")
      continue
    versions[name] = side.versions
    packages[side.packages["python"]] = side.packages
    side.close()
  return versions, packages, absent


def run(args, log=print) -> dict:
  result = {"machine": peers.machine(), "note": args.note, "args": {
      k: v for k, v in vars(args).items() if k != "json"}}
  model = args.model or os.path.join(args.cache, "loop_qwen3_add2")
  result["checkpoint"] = {"path": model, **loop_task.build_checkpoint(model, log=log)}
  result["versions"], result["packages"], result["absent"] = versions_of(
      args.side_names, args.peers_python, log)
  names = [n for n in args.side_names if n not in result["absent"]]
  if not any(n.startswith("ours") for n in names):
    raise RuntimeError("no side of ours to compare with")
  workdir = tempfile.mkdtemp(prefix="loop_compare_")
  spec = make_spec(args, model, workdir)
  specs = {}
  for name in names:
    specs[name] = os.path.join(workdir, f"spec_{name}.json")
    with open(specs[name], "w") as f:
      json.dump(dict(spec, ours_set=OURS_SETS.get(name, [])), f)
  result["task"] = {k: v for k, v in spec.items() if k not in ("prompts", "workdir")}
  result["task"]["prompts_per_step"] = [[p["prompt"] for p in b] for b in spec["prompts"]]
  result["ours_command"] = "jaxrl-scale train configs/cpu_tiny.yaml " + " ".join(
      peer_loops.ours_overrides(spec))
  runs: dict[str, list[dict]] = {n: [] for n in names}
  for r in range(args.rounds):
    log(f"=== round {r + 1} of {args.rounds}: {args.steps} steps x {args.prompts} prompts "
        f"x {args.group}, cap {args.cap} (load {os.getloadavg()[0]:.1f})")
    for name in names:
      python = sys.executable if name.startswith("ours") else args.peers_python
      res = run_side(name, python, specs[name], workdir, log)
      res["load_avg_after"] = os.getloadavg()
      runs[name].append(res)
  result["runs"] = runs
  result["summary"] = {n: [summarize(x) for x in v] for n, v in runs.items()}
  for name in OURS_SETS:
    if name in runs:
      result["summary"][f"{name}_same_prompts_per_step"] = [
          same_prompts(x["rows"], args.prompts) for x in runs[name]]
  result["vs"] = compare(runs)
  result["unequal"] = {n: list(LOOP_UNEQUAL[n]) for n in names}
  return result


def render(res: dict) -> str:
  lines = [f"checkpoint: {res['checkpoint']['path']} (warm start: "
           f"{res['checkpoint']['warm_start']})"]
  for name, why in res.get("absent", {}).items():
    lines.append(f"{name}: absent ({why})")
  for name, runs in res["runs"].items():
    s = [summarize(x) for x in runs]
    by_round = ", ".join(f"{x['median_step_s']:.3f}" for x in s)
    totals = ", ".join(f"{x['all_steps_s']:.1f}" for x in s)
    lines.append(f"{name:<15} median step "
                 f"{statistics.median(x['median_step_s'] for x in s):.3f} s ({by_round} by "
                 f"round); all {len(runs[0]['rows'])} steps {totals} s")
    ph = s[-1]["phases_median"]
    if ph:
      lines.append("    phases (median a step, last round): " + ", ".join(
          f"{k} {v:.3f}" for k, v in sorted(ph.items())))
    lines.append("    pass rate by step (last round): " + " ".join(
        f"{x:.2f}" if x is not None else "-" for x in s[-1]["pass_rate"]))
  for pair, vs in res["vs"].items():
    lines.append(f"{pair}: {vs['steps_per_s']['median']:.2f}x steps/s after the first (rounds: "
                 f"{', '.join(f'{x:.2f}' for x in vs['steps_per_s']['per_round'])}); time to "
                 f"all steps {vs['all_steps_time']['median']:.2f}x")
  for name, why in res["unequal"].items():
    lines += [f"  not equal, {name}:"] + [f"    - {x}" for x in why]
  return "\n".join(lines)


def main(argv=None) -> int:
  return peers.run_main("loop_compare", parse_args, run, render, argv)


if __name__ == "__main__":
  sys.exit(main())
