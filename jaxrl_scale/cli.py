"""`jaxrl-scale` command line: a thin dispatcher.

Each subcommand lives in the module that owns the capability and exposes two functions,
`add_arguments(parser)` and `run(args) -> int`. They are imported lazily so that, for
example, `jaxrl-scale fit` never pays for importing the model code.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import sys
from importlib import metadata

from jaxrl_scale.errors import UserError
from jaxrl_scale.parallel import xla_flags

# name -> (module, one-line help)
COMMANDS = {
    "train": ("jaxrl_scale.train", "train a policy from a YAML config (key=value overrides)"),
    "fit": ("jaxrl_scale.scaling.command", "fit the sigmoid scaling curve to metrics and forecast"),
    "generate": ("jaxrl_scale.envs.command",
                 "sample from a Hugging Face-format checkpoint (--env: multi-turn episodes)"),
    "plan": ("jaxrl_scale.plan.command", "compile a run's programs for a Cloud TPU slice or NVIDIA GPUs (none needed): HBM, FLOPs, roofline"),
    "reward": ("jaxrl_scale.rewards.command", "score one response with a verifier, showing the extracted answer"),
    "eval": ("jaxrl_scale.downstream.command", "mean@k and unbiased pass@k of a checkpoint on benchmark files (math, code)"),
    "export": ("jaxrl_scale.export", "write a run's trained policy as a Hugging Face directory"),
}


def _available_commands() -> dict[str, tuple[str, str]]:
  out = {}
  for name, (module, help_text) in COMMANDS.items():
    if importlib.util.find_spec(module) is not None:
      out[name] = (module, help_text)
  return out


def version_line() -> str:
  """The `--version` line, `jaxrl-scale X (jax Y, jaxlib Z)`, read from installed metadata.

  It never imports jax, so it answers even where jax cannot load.
  """

  def version(dist: str) -> str:
    try:
      return metadata.version(dist)
    except metadata.PackageNotFoundError:
      return "not installed"

  return (f"jaxrl-scale {version('jaxrl-scale')} "
          f"(jax {version('jax')}, jaxlib {version('jaxlib')})")


# Device files of the accelerators JAX's plugins drive: an NVIDIA driver, a TPU VM's chips
# (/dev/accel* on v4/v5p, VFIO groups on v5e/v6e), AMD's kernel driver.
ACCELERATOR_PATHS = ("/proc/driver/nvidia", "/dev/nvidia[0-9]*", "/dev/accel[0-9]*",
                     "/dev/vfio/[0-9]*", "/dev/kfd")


def default_platform(environ=os.environ, paths=ACCELERATOR_PATHS) -> str | None:
  """On a host with no accelerator, makes the CPU JAX's only runtime platform; returns it.

  The test and plan extras install libtpu and JAX's CUDA plugin, which compile for TPUs and
  GPUs without one. Asked for devices on a bare host, both still try to start: the CUDA
  plugin logs a traceback and libtpu a screen of warnings on every command. Compiling for a
  topology (`plan`) does not need them as runtime platforms. A JAX_PLATFORMS the user set is
  kept, and a host with any accelerator device file is left to JAX.
  """
  if "JAX_PLATFORMS" in environ or any(glob.glob(p) for p in paths):
    return None
  environ["JAX_PLATFORMS"] = "cpu"
  return "cpu"


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="jaxrl-scale",
      description="ScaleRL post-training on JAX, with sigmoidal compute-performance forecasting.",
  )
  parser.add_argument("-V", "--version", action="version", version=version_line())
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for name, (module, help_text) in _available_commands().items():
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(_module=module)
    importlib.import_module(module).add_arguments(p)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] in (["-V"], ["--version"]):
    # Answered before build_parser, which imports every command's module (and so jax).
    print(version_line())
    return 0
  default_platform()  # before build_parser imports jax: it reads JAX_PLATFORMS once
  parser = build_parser()
  args = parser.parse_args(argv)
  module = importlib.import_module(args._module)
  try:
    # Before any command opens a TPU backend or topology: libtpu reads its flags once.
    xla_flags.apply_tpu_flags()
    return int(module.run(args) or 0)
  except UserError as e:
    print(f"jaxrl-scale {args.command}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"jaxrl-scale {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
