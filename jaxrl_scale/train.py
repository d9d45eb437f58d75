"""`jaxrl-scale train CONFIG [key=value ...]`: one RL run from a config, end to end.

    jaxrl-scale train configs/cpu_tiny.yaml                 # the embedded CPU demo
    jaxrl-scale train configs/cpu_tiny.yaml rl.loss=grpo --output-dir runs/grpo
    jaxrl-scale train configs/cpu_tiny.yaml --resume        # continue from the last checkpoint

The run directory (run.output_dir, or --output-dir) holds config.yaml (the resolved
config), metrics.jsonl (one row per RL step: step, compute_hours, flops, train/*,
rollout/*, staleness/*, val/* and forecast/* on eval steps), sft.jsonl, tb/ (TensorBoard),
checkpoints/, forecast.png and summary.json. A directory that already has checkpoints is
resumed automatically; --overwrite starts afresh.

Wiring (this module) builds, in order: devices and the trainer / generator slices, the
tokenizer, prompts, the policy (random preset or Hugging Face directory), the SFT warm
start, the RL trainer, the sampler(s), the verifiers, the mode's rollout source, the
metrics stream, the checkpointer and the live forecaster; `pipeline.loop.Loop` runs the
steps. Only the standard library is imported at module level (the CLI builds every
subcommand's parser on each call).

Multi-host: the same command runs in every process. `jax.distributed` starts first
(`parallel.distributed.maybe_initialize`: auto-detected on Cloud TPU, else from
JAXRL_COORDINATOR / JAXRL_NUM_PROCESSES / JAXRL_PROCESS_ID); mesh.simulated_cpu_devices
then counts devices per process. The run directory must be one all processes share;
process 0 writes the files, every process writes its checkpoint shards.

    JAXRL_COORDINATOR=host0:8476 JAXRL_NUM_PROCESSES=2 JAXRL_PROCESS_ID=0 jaxrl-scale train ...
    JAXRL_COORDINATOR=host0:8476 JAXRL_NUM_PROCESSES=2 JAXRL_PROCESS_ID=1 jaxrl-scale train ...
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys

_PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent
DEFAULT_CONFIG = "configs/cpu_tiny.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
      "config", nargs="?", default=None,
      help=f"YAML config (default: the embedded CPU demo, {DEFAULT_CONFIG})")
  # REMAINDER, not "*": argparse cannot match a second positional chunk after an option,
  # so `train CONFIG a=1 --resume b=2` would fail; the flags in it are picked out in run().
  parser.add_argument("overrides", nargs=argparse.REMAINDER, metavar="key.sub=value",
                      help="dotted overrides of the config, e.g. rl.loss=grpo optim.lr=1e-6")
  parser.add_argument("--output-dir", default=None,
                      help="run directory (default: run.output_dir of the config)")
  parser.add_argument("--resume", action="store_true",
                      help="continue from the run directory's latest checkpoint (an error if "
                      "there is none; without the flag an existing checkpoint is resumed too)")
  parser.add_argument("--overwrite", action="store_true",
                      help="delete an existing run directory and start afresh")


def default_config_path() -> pathlib.Path:
  """configs/cpu_tiny.yaml next to the package (source checkout) or in the current dir."""
  for base in (_PACKAGE_ROOT.parent, pathlib.Path.cwd()):
    path = base / DEFAULT_CONFIG
    if path.exists():
      return path
  from jaxrl_scale.errors import UserError
  raise UserError(f"no config given and the embedded default {DEFAULT_CONFIG} was not found "
                  "next to the package or in the current directory")


def _pick_flags(args) -> list[str]:
  """Moves --resume / --overwrite / --output-dir X found among the overrides onto `args`."""
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top

  rest, items = [], list(args.overrides or [])
  while items:
    item = items.pop(0)
    if item in ("--resume", "--overwrite"):
      setattr(args, item[2:], True)
    elif item == "--output-dir" or item.startswith("--output-dir="):
      if "=" in item:
        args.output_dir = item.split("=", 1)[1]
      elif items:
        args.output_dir = items.pop(0)
      else:
        raise UserError("--output-dir needs a directory")
    elif item.startswith("-"):
      raise UserError(f"unknown option {item!r} (overrides are key.sub=value)")
    else:
      rest.append(item)
  return rest


def _split_args(args) -> tuple[pathlib.Path, list[str]]:
  config_path, overrides = args.config, _pick_flags(args)
  if config_path is not None and "=" in config_path and not config_path.endswith(
      (".yaml", ".yml")):
    overrides.insert(0, config_path)  # `jaxrl-scale train rl.loss=grpo`: no config given
    config_path = None
  return (pathlib.Path(config_path) if config_path else default_config_path()), overrides


def run(args) -> int:
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top

  config_path, overrides = _split_args(args)
  if args.output_dir is not None:
    overrides.append(f"run.output_dir={args.output_dir}")
  cfg = config_lib.load(config_path, overrides)
  if "://" in cfg.run.output_dir:
    raise UserError(f"config key 'run.output_dir': {cfg.run.output_dir!r} is a URL; the run "
                    "directory must be a filesystem path (on a pod: a shared mount, e.g. "
                    "gcsfuse, at the same path on every host)")
  run_dir = pathlib.Path(cfg.run.output_dir)

  # First of all, before anything initialises a JAX backend: on CPU, simulate the configured
  # devices (per process) so the trainer and generator slices exist (a config flag only; no
  # effect on TPU/GPU devices), then join the other processes (a no-op for one; it starts
  # the backend).
  from jaxrl_scale.parallel import distributed  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  mesh_lib.simulate_cpu_devices(cfg.mesh.simulated_cpu_devices)
  distributed.maybe_initialize()

  if args.overwrite and run_dir.exists() and distributed.is_primary():
    shutil.rmtree(run_dir)
  distributed.barrier("run directory ready")
  has_checkpoint = (run_dir / "checkpoints").is_dir() and any(
      p.name.isdigit() for p in (run_dir / "checkpoints").iterdir())
  if len(set(distributed.allgather(has_checkpoint, name="has_checkpoint"))) > 1:
    raise UserError(f"run directory {run_dir}: some processes see checkpoints and some do "
                    "not; run.output_dir must be a directory all processes share")
  # An interrupted SFT warm start left its state (no RL checkpoint yet): it continues.
  warm_state = (run_dir / "warm_start").is_dir() and any(
      p.name.isdigit() for p in (run_dir / "warm_start").iterdir())
  if args.resume and not (has_checkpoint or warm_state):
    raise UserError(f"--resume: no checkpoint in {run_dir / 'checkpoints'}")

  from jaxrl_scale.pipeline import loop as loop_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top
  try:
    result = wiring.train(cfg, run_dir, resume=has_checkpoint, config_path=str(config_path))
  except loop_lib.TrainingAborted as e:
    print(f"jaxrl-scale train: {e}", file=sys.stderr)
    return 3
  return 0 if result.reason in ("done", "signal") else 1


def main(argv: list[str] | None = None) -> int:
  """`python -m jaxrl_scale.train ...` (the same as `jaxrl-scale train ...`)."""
  parser = argparse.ArgumentParser(prog="jaxrl-scale train")
  add_arguments(parser)
  args = parser.parse_args(argv)
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.parallel import xla_flags  # pylint: disable=g-import-not-at-top
  try:
    xla_flags.apply_tpu_flags()  # before JAX opens a TPU: libtpu reads its flags once
    return run(args)
  except UserError as e:
    print(f"jaxrl-scale train: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  os.environ.setdefault("PYTHONUNBUFFERED", "1")
  sys.exit(main())
