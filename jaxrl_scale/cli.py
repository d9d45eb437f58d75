"""`jaxrl-scale` command line: a thin dispatcher.

Each subcommand lives in the module that owns the capability and exposes two functions,
`add_arguments(parser)` and `run(args) -> int`. They are imported lazily so that, for
example, `jaxrl-scale fit` never pays for importing the model code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from jaxrl_scale.errors import UserError

# name -> (module, one-line help)
COMMANDS = {
    "train": ("jaxrl_scale.train", "train a policy from a YAML config (key=value overrides)"),
    "fit": ("jaxrl_scale.scaling.command", "fit the sigmoid scaling curve to metrics and forecast"),
    "generate": ("jaxrl_scale.generation.command", "sample from a Hugging Face-format checkpoint"),
    "plan": ("jaxrl_scale.plan.command", "compile a run's programs for a Cloud TPU topology (no TPU needed): HBM, FLOPs, roofline"),
    "reward": ("jaxrl_scale.rewards.command", "score one response with a verifier, showing the extracted answer"),
}


def _available_commands() -> dict[str, tuple[str, str]]:
  out = {}
  for name, (module, help_text) in COMMANDS.items():
    if importlib.util.find_spec(module) is not None:
      out[name] = (module, help_text)
  return out


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="jaxrl-scale",
      description="ScaleRL post-training on JAX, with sigmoidal compute-performance forecasting.",
  )
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for name, (module, help_text) in _available_commands().items():
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(_module=module)
    importlib.import_module(module).add_arguments(p)
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  module = importlib.import_module(args._module)
  try:
    return int(module.run(args) or 0)
  except UserError as e:
    print(f"jaxrl-scale {args.command}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"jaxrl-scale {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
