"""The whole RL loop, phase by phase, beside its own programs measured alone (issue 62).

    python benchmarks/train/rl_loop_bench.py  # configs/cpu_tiny.yaml, sync + pipeline
    python benchmarks/train/rl_loop_bench.py configs/scalerl_qwen3_0p6b_h100.yaml model.path=null \
        data.max_prompt_tokens=128 sampler.max_new_tokens=1024 --modes colocated --json

It runs `jaxrl-scale train`'s own code (`pipeline.wiring.train`, the loop of `pipeline.loop`)
for `--steps` RL steps per mode (`pipeline.mode`: sync, colocated, pipeline, ppo_offpolicy),
each from the same random initial policy (model.path=null: the preset's shape, random
weights; or any Hugging Face directory), without SFT, forecast or No-Positive-Resampling,
on a synthetic task whose reward a random policy earns both ways: `--prompt-len` tokens of
random words, rewarded by the parity of a hash of the response's text (`coin`, registered
here), so advantages are not all zero and the groups train. Evals and checkpoints run only
when asked (`--eval-every`, `--checkpoint-every`; the run's final checkpoint is skipped).

The loop's trainer and sampler are timed where the loop calls them (`wiring.train(on_loop=)`
hands the bench the `Loop`; the bench wraps its objects' methods, the loop is unchanged):

  generate   Sampler.generate of the step's groups (sync modes; pipelined: the generator
             thread's time not stalled by the staleness bound or a full queue, from
             gen/idle_frac, beside the trainer rather than inside the step)
  score      the verifiers over the step's groups (sync modes)
  train      Trainer.step, until its outputs are computed
  update     Sampler.update_params, the trainer -> generator weight update (cast / copy /
             reshard), until the new weights are computed in sync modes (the swap itself
             happens at the next generate's first chunk and is part of generate)
  eval, checkpoint, compile     the loop's own time/*_s
  wait       the trainer waiting for rollouts (sync modes: generate + score + admission)
  other      the rest of the step's wall time (batching, metrics, bookkeeping)

The first `--warmup` steps (compiles) are not timed; the report is the median over the
rest. Tokens per second per device, over the step's wall time and all devices of both roles:
generated (the completions' sampled tokens) and trained (train/tokens: every valid position
of the batch, prompt and completion). The train phase's MFU against the chip's
bf16 spec (`train_step_bench.spec_peak`, by exact device kind; none if unknown) and the generate phase's fraction of the HBM
roofline (`sampler_bench._roofline`, prefill included in its time) on a GPU/TPU.

Then, in the same process, after the first mode's run, its own programs alone on the same
work, `--repeats` times (medians): the weight update, generate of the last step's requests,
and Trainer.step on the last step's batch. Loop efficiency = (generate alone + train alone)
/ the loop's median step wall time: 1.0 is a loop that adds nothing to its two programs.
Peak device memory per phase (GPU/TPU: bytes in use and the process's peak after each
phase; the peak never resets, so a phase shows the peak it raised). `--json` prints one JSON
line last (the report then goes to stderr).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.* and jaxrl_scale from this tree

PHASES = ("generate", "score", "train", "update", "eval", "checkpoint", "compile", "wait",
          "other")
COIN = "coin"  # the synthetic task and its reward


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("config", nargs="?", default=str(ROOT / "configs" / "cpu_tiny.yaml"))
  p.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
  p.add_argument("--steps", type=int, default=8, help="RL steps per mode")
  p.add_argument("--warmup", type=int, default=2, help="leading steps not timed")
  p.add_argument("--modes", default="sync,pipeline",
                 help="comma-separated pipeline.mode values, each run in turn")
  p.add_argument("--prompt-len", type=int, default=None,
                 help="prompt tokens (default: data.max_prompt_tokens)")
  p.add_argument("--repeats", type=int, default=3, help="runs of each program alone")
  p.add_argument("--no-alone", action="store_true", help="skip the programs alone")
  p.add_argument("--eval-every", type=int, default=0, help="eval.every (0: no evals)")
  p.add_argument("--checkpoint-every", type=int, default=0,
                 help="checkpoint.every (0: no checkpoints at all)")
  p.add_argument("--json", action="store_true", help="print one JSON line last")
  args = p.parse_args(argv)
  if "=" in args.config and not args.config.endswith((".yaml", ".yml")):
    args.overrides.insert(0, args.config)  # overrides of the default config
    args.config = str(ROOT / "configs" / "cpu_tiny.yaml")
  if args.steps <= args.warmup + 1:
    p.error(f"--steps {args.steps} must exceed --warmup + 1 = {args.warmup + 1}")
  modes = args.modes.split(",")
  bad = [m for m in modes if m not in ("sync", "colocated", "pipeline", "ppo_offpolicy")]
  if bad:
    p.error(f"--modes: {bad[0]!r} is not sync, colocated, pipeline or ppo_offpolicy")
  args.modes = modes
  if args.prompt_len is not None and args.prompt_len < 2:
    p.error("--prompt-len must be >= 2")
  return args


# ---- the synthetic task -----------------------------------------------------------------------


def coin(response: str, answer: str) -> bool:
  """Correct when a hash of the response's text is even: a random policy earns it about
  half the time, any policy both ways (the answer plays no part)."""
  del answer
  return hashlib.blake2b(response.encode("utf-8", "replace"), digest_size=1).digest()[0] % 2 == 0


def register_coin() -> None:
  """The `coin` task and reward, in this process only."""
  from jaxrl_scale.data import tasks  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.rewards import registry  # pylint: disable=g-import-not-at-top

  if COIN not in registry._REWARDS:  # pylint: disable=protected-access
    registry.register_reward(COIN)(coin)
  tasks.REWARD_FOR_TASK.setdefault(COIN, COIN)


def write_prompts(path: pathlib.Path, tok, count: int, length: int, seed: int = 0) -> None:
  """`count` prompts of random words, each `length` tokens or a few fewer under `tok`."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  with path.open("w") as f:
    for i in range(count):
      words = " ".join("".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(length))
      text = tok.decode(tok.encode(words)[:length - 1])
      while len(tok.encode(text)) > length - 1:  # a decode may re-encode longer
        text = text[:-1]
      f.write(json.dumps({"id": f"coin-{i}", "prompt": text, "answer": "0"}) + "\n")


# ---- instrumenting the loop --------------------------------------------------------------------


def _memory(device) -> dict[str, int] | None:
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if not stats or "bytes_in_use" not in stats:
    return None  # CPU
  return {"in_use": int(stats["bytes_in_use"]),
          "peak": int(stats.get("peak_bytes_in_use", stats["bytes_in_use"]))}


class Probe:
  """Wraps the loop's trainer, sampler, scorer and admitter (instance attributes over their
  methods) and adds up each phase's seconds per step; keeps the last step's work."""

  def __init__(self, loop, sync: bool):
    import jax  # pylint: disable=g-import-not-at-top

    self.jax = jax
    self.loop = loop
    self.seconds: dict[str, float] = {}
    self.memory: dict[str, dict[str, int]] = {}
    self.batch = None
    self.requests: list = []
    self._admitted: list = []
    self.in_eval = False
    source = loop.source
    self.sampler = getattr(source.sampler, "sampler", source.sampler)  # preempt.Interruptible
    self.device = loop.trainer.mesh.devices.flat[0]
    self._wrap(loop.trainer, "step", "train", block=True, keep_batch=True)
    self._wrap(self.sampler, "update_params", "update", block=sync)
    self._wrap(self.sampler, "generate", "generate", block=False)
    scorer = getattr(source, "scorer", None)
    if scorer is not None and sync:
      self._wrap(scorer, "groups", "score", block=False)
    admit = source.admitter.admit

    def admitted(version):
      out = admit(version)
      self._admitted.append(out[2])
      return out

    source.admitter.admit = admitted
    evaluate = loop.evaluate

    def evaluated(step):
      self.in_eval = True
      try:
        return evaluate(step)
      finally:
        self.in_eval = False

    loop.evaluate = evaluated

  def _wrap(self, obj, name: str, phase: str, *, block: bool, keep_batch: bool = False):
    inner = getattr(obj, name)

    def timed(*args, **kwargs):
      if self.in_eval:
        return inner(*args, **kwargs)
      chunks = self.sampler.stats.chunks
      t = time.perf_counter()
      out = inner(*args, **kwargs)
      if phase == "generate":  # decode steps dispatched, for the roofline
        self.seconds["decode_steps"] = self.seconds.get("decode_steps", 0.0) + (
            self.sampler.stats.chunks - chunks) * self.sampler.cfg.decode_chunk
      if block:
        self.jax.block_until_ready(out if phase == "train" else self.sampler.params)
      self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t
      if keep_batch:
        self.batch = args[0]
      memory = _memory(self.device)
      if memory is not None:
        self.memory[phase] = memory
      return out

    setattr(obj, name, timed)

  def take(self) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
    """The phases' seconds and memory since the last call; keeps this step's requests."""
    seconds, memory, self.seconds, self.memory = self.seconds, self.memory, {}, {}
    p = self.loop.shape.num_prompts
    if len(self._admitted) >= p:
      self.requests = [r for group in self._admitted[-p:] for r in group]
    self._admitted = self._admitted[-p:]
    return seconds, memory


def step_record(row: dict[str, Any], seconds: dict[str, float], memory, devices: int,
                group_size: int) -> dict[str, Any]:
  """One step's phases (s), tokens per second per device and memory."""
  out = {k if k == "decode_steps" else f"{k}_s": v for k, v in seconds.items()}
  for kind in ("eval", "checkpoint", "compile", "wait"):
    out[f"{kind}_s"] = float(row.get(f"time/{kind}_s", 0.0))
  wall = float(row["time/step_s"])
  if "generate_s" not in out and row.get("gen/idle_frac") is not None:
    # The pipelined generator thread: the step's wall time less its stalls.
    out["generate_s"] = (1.0 - float(row["gen/idle_frac"])) * wall
  out["step_s"] = wall
  # Sync modes: generate and score happen inside the trainer's wait; the rest is other.
  inside = ("train", "update", "eval", "checkpoint", "wait")
  out["other_s"] = max(0.0, wall - sum(out.get(f"{k}_s", 0.0) for k in inside))
  generated = (row.get("rollout/length_mean", 0.0) * row.get("rollout/num_groups", 0.0)
               * group_size)
  out["generated_tokens"] = generated
  out["trained_tokens"] = float(row.get("train/tokens", 0.0))
  out["generated_tok_s_per_device"] = generated / wall / devices
  out["trained_tok_s_per_device"] = out["trained_tokens"] / wall / devices
  # The coin's pass rate (about half) and the generator's idle share of the step.
  for key, name in (("rollout/pass_rate", "pass_rate"), ("gen/idle_frac", "gen_idle_frac")):
    if row.get(key) is not None:
      out[name] = float(row[key])
  if memory:
    out["memory"] = memory
  return out


def medians(steps: list[dict[str, Any]]) -> dict[str, float]:
  keys = dict.fromkeys(k for s in steps for k, v in s.items() if isinstance(v, (int, float)))
  return {k: statistics.median(s.get(k, 0.0) for s in steps) for k in keys}


# ---- one mode ---------------------------------------------------------------------------------


def run_mode(args, mode: str, data_path: pathlib.Path, log, alone: bool) -> dict[str, Any]:
  """Runs the loop in `mode`; with `alone`, then its programs alone on the same work."""
  import io  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  sync = mode != "pipeline"
  probes: list[Probe] = []
  steps: list[dict[str, Any]] = []

  def on_loop(loop) -> None:
    probe = Probe(loop, sync)
    if not args.checkpoint_every:  # the run's last checkpoint would write the trainer state
      loop.checkpointer = None
    probes.append(probe)

  def on_step(step: int, row: dict[str, Any]) -> None:
    probe = probes[0]
    seconds, memory = probe.take()
    steps.append(step_record(row, seconds, memory, probe.loop.clock.num_devices,
                             probe.loop.shape.group_size))
    s = steps[-1]
    log(f"  {mode} step {step}: {s['step_s']:.3f} s | " + ", ".join(
        f"{k} {s[f'{k}_s']:.3f}" for k in PHASES if s.get(f"{k}_s")))

  with tempfile.TemporaryDirectory() as run_dir:
    cfg = config_lib.load(args.config, [
        *args.overrides, f"pipeline.mode={mode}", f"run.steps={args.steps}", "sft.steps=0",
        f"data.source={data_path}", f"data.task={COIN}", "data.chat_template=false",
        "data.num_validation=16", "rl.no_positive_resampling=false",
        f"eval.every={args.eval_every}", f"checkpoint.every={args.checkpoint_every}",
        "run.progress=false", "run.tensorboard=false", "forecast.enabled=false",
        f"run.output_dir={run_dir}"])
    wiring.train(cfg, run_dir, stream=io.StringIO(), on_step=on_step, on_loop=on_loop)
  probe = probes[0]
  timed = steps[args.warmup:]
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top

  # A step whose groups all had equal rewards trains nothing (the loop skips its update).
  untrained = sum(1 for s in timed if not s.get("train_s"))
  if timed and untrained == len(timed):
    raise UserError(
        f"{mode}: no timed step trained (every group's rewards were equal, so the loop "
        "skipped each update). The coin reward hashes the decoded text, and a random policy "
        "over a vocabulary its tokenizer cannot decode (a preset's, with the byte tokenizer) "
        "writes mostly empty text: raise sampler.max_new_tokens, or give model.path a "
        "checkpoint with its tokenizer")
  result: dict[str, Any] = {"steps": steps, "median": medians(timed),
                            "devices": probe.loop.clock.num_devices,
                            "untrained_steps": untrained}
  peak = {k: max(s["memory"][k]["peak"] for s in steps if k in s.get("memory", {}))
          for k in PHASES if any(k in s.get("memory", {}) for s in steps)}
  if peak:
    result["peak_bytes_after"] = peak
  result.update(rates(probe, cfg, result["median"], log))
  if alone:
    result["alone"] = programs_alone(probe, args.repeats, log)
  # The wrappers close over the probe, which holds the loop: a cycle, so the trainer's and
  # sampler's device buffers go only when it is collected, before the next mode allocates.
  del probes[:], probe
  gc.collect()
  jax.clear_caches()
  return result


def rates(probe: Probe, cfg, med: dict[str, float], log) -> dict[str, Any]:
  """The train phase's MFU and the generate phase's fraction of the HBM roofline."""
  import types  # pylint: disable=g-import-not-at-top

  from benchmarks.train import train_step_bench  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  mcfg = wiring.policy_config(cfg)
  shape = probe.loop.shape
  rows = shape.num_prompts * shape.group_size
  flops = train_step_bench.model_flops(mcfg, train_step_bench.flop_params(
      mcfg, mcfg.num_params()), rows, shape.seq_len)
  out: dict[str, Any] = {"train_model_tflop": flops / 1e12, "rows": rows,
                         "seq_len": shape.seq_len}
  devices = len(probe.loop.trainer.mesh.devices.flat)
  spec = train_step_bench.spec_peak(probe.device.device_kind)
  if spec is not None and med.get("train_s"):
    out["train_mfu"] = flops / med["train_s"] / devices / (spec * 1e12)
  if med.get("decode_steps") and probe.device.platform != "cpu":  # sync modes
    from benchmarks.sampler import sampler_bench  # pylint: disable=g-import-not-at-top
    # Every slot decodes each step, a wave of them per num_slots rows (prefill's time is in
    # generate_s too, so the fraction is a little low).
    decode_steps = med.get("decode_steps") or cfg.sampler.max_new_tokens
    ns = types.SimpleNamespace(hbm_gbps=None, batch=probe.sampler.num_slots)
    line, fields = sampler_bench._roofline(  # pylint: disable=protected-access
        probe.sampler, mcfg, ns, med["generate_s"] / decode_steps,
        cfg.data.max_prompt_tokens + cfg.sampler.max_new_tokens / 2)
    log(f"  generate phase {line}")
    if "fraction_of_roofline" in fields:
      out["generate_fraction_of_roofline"] = fields["fraction_of_roofline"]
  return out


def programs_alone(probe: Probe, repeats: int, log) -> dict[str, float]:
  """The weight update, generate and train step alone on the last step's work (medians)."""
  jax = probe.jax
  loop, sampler = probe.loop, probe.sampler
  trainer = loop.trainer
  times: dict[str, list[float]] = {"update": [], "generate": [], "train": []}
  version = loop.state.step
  for _ in range(repeats):
    version += 1
    t = time.perf_counter()
    sampler.update_params(trainer.params, version)
    jax.block_until_ready(sampler.params)
    times["update"].append(time.perf_counter() - t)
    t = time.perf_counter()
    sampler.generate(probe.requests)  # swaps the new weights in first, as in the loop
    times["generate"].append(time.perf_counter() - t)
    t = time.perf_counter()
    jax.block_until_ready(trainer.step(probe.batch))
    times["train"].append(time.perf_counter() - t)
  out = {f"{k}_s": statistics.median(v) for k, v in times.items()}
  log("  alone: " + ", ".join(f"{k} {v:.3f} s" for k, v in out.items()))
  return out


# ---- the report -------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top

  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = None
  device = jax.devices()[0]
  return {"device": f"{device.device_kind} x{jax.device_count()}", "platform": device.platform,
          "jax": jax.__version__, "commit": commit, "cpu_cores": os.cpu_count()}


def summarise(report: dict[str, Any], log) -> None:
  alone = next((r["alone"] for r in report["modes"].values() if "alone" in r), None)
  for mode, r in report["modes"].items():
    m = r["median"]
    phases = ", ".join(f"{k} {m[f'{k}_s']:.3f}" for k in PHASES if m.get(f"{k}_s"))
    log(f"{mode}: {m['step_s']:.3f} s/step (median of {len(r['steps']) - report['warmup']}) | "
        f"{phases} (s)")
    log(f"  per device: {m['generated_tok_s_per_device']:.0f} generated tok/s, "
        f"{m['trained_tok_s_per_device']:.0f} trained tok/s"
        + (f" | train MFU {r['train_mfu']:.1%}" if "train_mfu" in r else "")
        + (f" | generate at {r['generate_fraction_of_roofline']:.1%} of the HBM roofline"
           if "generate_fraction_of_roofline" in r else ""))
    if alone is not None:
      r["loop_efficiency"] = (alone["generate_s"] + alone["train_s"]) / m["step_s"]
      r["update_share_of_step"] = m.get("update_s", 0.0) / m["step_s"]
      inside = []
      for k in ("generate", "train"):
        # A pipelined generator's busy time runs beside the step, not inside it.
        if m.get(f"{k}_s") and not (k == "generate" and mode == "pipeline"):
          r[f"{k}_in_loop_over_alone"] = m[f"{k}_s"] / alone[f"{k}_s"]
          inside.append(f"{k} {r[f'{k}_in_loop_over_alone']:.2f}x")
      log(f"  loop efficiency {r['loop_efficiency']:.2f} ((generate + train alone) / step) | "
          f"in the loop over alone: {', '.join(inside)} | weight update "
          f"{r['update_share_of_step']:.1%} of a step")
    if r.get("untrained_steps"):
      log(f"  {r['untrained_steps']} timed step(s) trained nothing (equal rewards in every "
          "group): the medians count their train phase as 0")
    if "peak_bytes_after" in r:
      log("  peak device memory after: " + ", ".join(
          f"{k} {v / 2**30:.2f} GiB" for k, v in r["peak_bytes_after"].items()))


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  out = sys.stderr if args.json else sys.stdout

  def log(line: str) -> None:
    print(line, file=out, flush=True)

  try:
    cfg = config_lib.load(args.config, args.overrides)
  except UserError as e:
    print(f"rl_loop_bench: error: {e}", file=sys.stderr)
    return 2
  mesh_lib.simulate_cpu_devices(cfg.mesh.simulated_cpu_devices)
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  register_coin()
  prompt_len = args.prompt_len or cfg.data.max_prompt_tokens
  config_name = os.path.relpath(os.path.abspath(args.config), ROOT)
  report: dict[str, Any] = {**environment(), "config": config_name,
                            "overrides": args.overrides, "steps": args.steps,
                            "warmup": args.warmup, "prompt_len": prompt_len,
                            "prompts": cfg.rl.prompts_per_step,
                            "samples": cfg.rl.generations_per_prompt,
                            "max_new_tokens": cfg.sampler.max_new_tokens, "modes": {}}
  log(f"rl_loop_bench: {args.config} {' '.join(args.overrides)} | {report['device']} | "
      f"{cfg.rl.prompts_per_step} prompts x {cfg.rl.generations_per_prompt} samples of "
      f"{prompt_len} + {cfg.sampler.max_new_tokens} tokens | {args.steps} steps per mode, "
      f"first {args.warmup} untimed")
  with tempfile.TemporaryDirectory() as tmp:
    data = pathlib.Path(tmp) / "coin.jsonl"
    count = cfg.rl.prompts_per_step * (args.steps + 2) * 2 + 16
    write_prompts(data, wiring.load_tokenizer(cfg), count, prompt_len)
    try:
      for i, mode in enumerate(args.modes):
        report["modes"][mode] = run_mode(args, mode, data, log,
                                         alone=i == 0 and not args.no_alone)
    except UserError as e:
      print(f"rl_loop_bench: error: {e}", file=sys.stderr)
      return 2
  summarise(report, log)
  if args.json:
    print(json.dumps(report), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
