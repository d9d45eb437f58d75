"""Where our whole RL loop spends a step: the loop of `jaxrl-scale train` at loop_compare's
task, its train phase split into its parts, beside the same compiled step run alone.

    python benchmarks/peers/profile_loop.py /tmp/jaxrl_peers/loop_qwen3_add2
    python benchmarks/peers/profile_loop.py CHECKPOINT --colocated --steps 24
    python benchmarks/peers/profile_loop.py CHECKPOINT --set mesh.simulated_cpu_devices=2

The run is `wiring.train` on configs/cpu_tiny.yaml with `peer_loops.ours_overrides` (what
loop_compare.py runs), in this process, with timers wrapped around the parts of the train
phase (`Loop._train_step`): building the batch, dispatching the step, posting the weights
to the sampler, and fetching the metrics (which waits for the step's computation). After
the run, the trainer's compiled step runs alone on the last batch, `--alone` times: the
step's computation with nothing beside it, alternating with the same step built with one
of the CPU program's choices flipped (`placement.cpu_program`): the other layer loop
(`Trainer.unroll_layers`: unrolled on CPU, else one scan) and the other projections
(`Trainer.flat_projections`: 2-D matmuls on CPU, else [B, T, D]). Prints medians over the
steps after the first (which compiles) and writes `--json`.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]

import loop_task  # noqa: E402  pylint: disable=wrong-import-position
import peer_loops  # noqa: E402  pylint: disable=wrong-import-position
from benchmarks.peers import loop_compare  # noqa: E402  pylint: disable=wrong-import-position


class _Timers:
  """Seconds per named part, one list entry per step."""

  def __init__(self):
    self.parts: dict[str, list[float]] = collections.defaultdict(list)
    self._open: dict[str, float] = collections.defaultdict(float)

  def wrap(self, name: str, fn):
    def timed(*args, **kwargs):
      t = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        self._open[name] += time.perf_counter() - t
    return timed

  def end_step(self, names) -> None:
    for name in names:
      self.parts[name].append(self._open.pop(name, 0.0))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("model", help="loop_task's checkpoint (loop_compare.py writes it; built here "
                 "when the directory does not exist)")
  p.add_argument("--steps", type=int, default=16)
  p.add_argument("--colocated", action="store_true",
                 help="one simulated device, generate then train (ours_colocated)")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a config override after loop_compare's (repeatable)")
  p.add_argument("--alone", type=int, default=10, help="timed runs of the step alone")
  p.add_argument("--trace", action="store_true",
                 help="also run the step alone under JAX's profiler and print its costliest "
                 "XLA operations")
  p.add_argument("--json", default=None, help="write the medians and per-step parts here")
  args = p.parse_args(argv)
  if not os.path.isdir(args.model):
    loop_task.build_checkpoint(args.model)
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  # Before anything starts a JAX backend (as `jaxrl-scale train` does first): the run's
  # simulated CPU devices.
  first = config_lib.load(peer_loops.BASE_CONFIG, (loop_compare.COLOCATED if args.colocated
                                                   else []) + args.set)
  mesh_lib.simulate_cpu_devices(first.mesh.simulated_cpu_devices)
  spec = loop_compare.make_spec(loop_compare.parse_args(["--steps", str(args.steps)]),
                                args.model, workdir="")
  overrides = peer_loops.ours_overrides(spec)
  if args.colocated:
    overrides += loop_compare.COLOCATED
  overrides += args.set

  import jax  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import loop as loop_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import rollouts  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  cfg = config_lib.load(peer_loops.BASE_CONFIG, overrides)
  timers = _Timers()
  names = ("build_batch", "trainer.step", "after_step (weight post)",
           "device_get (metrics: waits for the step)")
  rows, held = [], {}

  def on_loop(loop):
    held["loop"] = loop
    trainer, source = loop.trainer, loop.source
    orig_step = trainer.step

    def step(batch):
      held["batch"] = batch
      return orig_step(batch)
    trainer.step = timers.wrap(names[1], step)
    source.after_step = timers.wrap(names[2], source.after_step)

  orig_build, orig_get = rollouts.build_batch, jax.device_get
  loop_lib.rollouts = _Namespace(rollouts, build_batch=timers.wrap(names[0], orig_build))
  loop_lib.jax = _Namespace(jax, device_get=timers.wrap(names[3], orig_get))

  def on_step(step, row):
    timers.end_step(names)
    rows.append({k: row[k] for k in ("time/wait_s", "time/train_s", "time/step_s")
                 if k in row})

  with tempfile.TemporaryDirectory() as work:
    try:
      wiring.train(cfg, os.path.join(work, "run"), on_step=on_step, on_loop=on_loop)
    finally:
      loop_lib.rollouts, loop_lib.jax = rollouts, jax
    trainer, batch = held["loop"].trainer, held["batch"]
    # The step alone, alternating with the same step built with one of the CPU program's
    # choices flipped (`placement.cpu_program`: the layer loop, `Trainer.unroll_layers`;
    # the projections' matmuls, `Trainer.flat_projections`), each compiled once, so that
    # all see the same machine.
    run = (trainer.unroll_layers, trainer.flat_projections)
    programs = {"run": trainer._compiled}  # pylint: disable=protected-access
    for name, choice in (("layers_flipped", (not run[0], run[1])),
                         ("projections_flipped", (run[0], not run[1]))):
      trainer.unroll_layers, trainer.flat_projections = choice
      trainer._jitted = trainer._compiled = None  # pylint: disable=protected-access
      trainer.compile(batch)
      programs[name] = trainer._compiled  # pylint: disable=protected-access
    trainer.unroll_layers, trainer.flat_projections = run
    alone = {name: [] for name in programs}
    for _ in range(args.alone + 1):
      for name, program in programs.items():
        trainer._compiled = program  # pylint: disable=protected-access
        t = time.perf_counter()
        jax.block_until_ready(trainer.step(batch))
        alone[name].append(time.perf_counter() - t)
    trainer._compiled = programs["run"]  # pylint: disable=protected-access
    top_ops = _trace_ops(trainer, batch, work) if args.trace else None

  def med(values):
    values = values[1:]  # the first step compiles
    return statistics.median(values) if values else float("nan")

  out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "load_average_at_end": os.getloadavg(), "commit": _commit(),
         "model": args.model, "steps": args.steps, "overrides": overrides,
         "devices": len(jax.devices()), "jax": jax.__version__,
         "loop_median_s": {k: med([r[k] for r in rows]) for k in rows[0]},
         "train_phase_median_s": {n: med(timers.parts[n]) for n in names},
         "step_alone_median_s": {n: statistics.median(v[1:]) for n, v in alone.items()},
         "run_program": {"layers_unrolled": run[0], "flat_projections": run[1]},
         "step_alone_top_ops": top_ops,
         "per_step": {"rows": rows, "parts": dict(timers.parts)}}
  mode = "colocated, one device" if args.colocated else "pipelined (configs/cpu_tiny.yaml)"
  print(f"our loop, {mode}, {args.steps} steps; medians over steps 2..{args.steps}:")
  for k, v in out["loop_median_s"].items():
    print(f"  {k:<44} {v * 1e3:8.1f} ms")
  print("the train phase's parts:")
  for k, v in out["train_phase_median_s"].items():
    print(f"  {k:<44} {v * 1e3:8.1f} ms")
  alone_s = out["step_alone_median_s"]
  what = {"run": (f"as run (layers {'unrolled' if run[0] else 'in one scan'}, projections "
                  f"{'2-D' if run[1] else '3-D'})"),
          "layers_flipped": f"layers {'in one scan' if run[0] else 'unrolled'}",
          "projections_flipped": f"projections {'3-D' if run[1] else '2-D'}"}
  print(f"the compiled step alone on the last batch ({args.alone} runs each, alternating):")
  for name, sec in alone_s.items():
    print(f"  {what[name]:<44} {sec * 1e3:8.1f} ms  ({sec / alone_s['run']:.2f}x the run's)")
  if top_ops:
    print(f"the step alone under the profiler ({_TRACED} runs), its costliest operations "
          "(summed over the XLA threads; they run side by side):")
    for name, (ms, count) in top_ops.items():
      print(f"  {ms:8.1f} ms  x{count:<5} {name}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return 0


_TRACED = 3


def _commit() -> str | None:
  import subprocess  # pylint: disable=g-import-not-at-top
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def _trace_ops(trainer, batch, work: str, top: int = 25) -> dict[str, tuple[float, int]]:
  """The step run `_TRACED` times under JAX's profiler: milliseconds and count per XLA
  operation (events on the XLA threads of the host plane), costliest first."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top

  out = os.path.join(work, "trace")
  with jax.profiler.trace(out):
    for _ in range(_TRACED):
      jax.block_until_ready(trainer.step(batch))
  trace = ProfileData.from_file(glob.glob(out + "/**/*.xplane.pb", recursive=True)[0])
  total, count = collections.Counter(), collections.Counter()
  for plane in trace.planes:
    for line in plane.lines:
      if "python" in line.name.lower():
        continue
      for ev in line.events:
        total[ev.name] += ev.duration_ns
        count[ev.name] += 1
  return {name: (ns / 1e6, count[name]) for name, ns in total.most_common(top)}


class _Namespace:
  """A module with some attributes replaced (the loop's view of `rollouts` and `jax`)."""

  def __init__(self, module, **replaced):
    self._module, self._replaced = module, replaced

  def __getattr__(self, name):
    return self._replaced.get(name, getattr(self._module, name))


if __name__ == "__main__":
  sys.exit(main())
