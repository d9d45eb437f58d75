"""`jaxrl-scale plan CONFIG [key=value ...] --topology NAME [--json]`.

Compiles every program of the run for a Cloud TPU slice on this machine (libtpu, no TPU
attached) and prints, per program and per chip, HBM against capacity, compiled against
model FLOPs, the roofline bound and the MFU it allows, and the compile time:

    jaxrl-scale plan configs/scalerl_qwen3_8b.yaml --topology v5p-128
    jaxrl-scale plan configs/cpu_tiny.yaml --topology v5e:2x2 --json

It needs no weights, tokenizer or data: the model comes from model.path's config.json or,
when that directory is absent, from model.preset. Exit 0 when everything fits and compiles,
1 (with one line naming the program, the shortfall and what to change) otherwise, 2 on bad
input.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from jaxrl_scale.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("config", help="the run's YAML config")
  parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                      help="dotted overrides of the config, as for train")
  parser.add_argument("--topology", required=True,
                      help="Cloud TPU accelerator type (v5p-128, v6e-64, v5litepod-256, v4-64), "
                      "chip topology (v5p:4x4x4), or NVIDIA GPUs (h100, h200, a100, h100-8)")
  parser.add_argument("--programs", metavar="NAME,...",
                      help="compile only these programs (train_step, sft_step, weight_cast, "
                      "prefill, decode), e.g. prefill,decode while sizing the generator")
  parser.add_argument("--json", action="store_true", help="print one JSON object")


def _model_config(cfg, note):
  """The policy's ModelConfig without weights or tokenizer."""
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  spec = cfg.model
  if spec.path is not None and not (pathlib.Path(spec.path) / "config.json").exists():
    note(f"model.path {spec.path} has no config.json here: planning with model.preset "
         f"{spec.preset}")
    spec = None
  try:
    return wiring.model_config_for(cfg, None) if spec is None else wiring.policy_config(cfg)
  except ValueError as e:
    raise UserError(f"config key 'model.preset': {e}") from None


def run(args: argparse.Namespace) -> int:
  # The default backend stays the CPU; libtpu only compiles. Several libtpu loads (tests in
  # parallel, a second plan) need the lock off.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")  # silences libtpu's host probe
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.plan import chips, report  # pylint: disable=g-import-not-at-top

  sl = chips.resolve(args.topology)
  cfg = config_lib.load(args.config, list(args.overrides))
  quiet = args.json
  say = (lambda s: print(s, file=sys.stderr, flush=True)) if quiet else (
      lambda s: print(s, flush=True))
  mcfg = _model_config(cfg, say)
  say(f"jaxrl-scale plan {args.config} --topology {args.topology} ({sl.topology}, "
      f"{sl.chips} {sl.chip.name} chips)")
  only = None
  if args.programs:
    only = [p.strip() for p in args.programs.split(",") if p.strip()]
    unknown = sorted(set(only) - set(report.PROGRAMS))
    if unknown:
      raise UserError(f"--programs: unknown program {unknown[0]!r}; choose from "
                      f"{', '.join(report.PROGRAMS)}")
  plan = report.run_plan(cfg, mcfg, sl, progress=say, only=only)
  if args.json:
    print(json.dumps(plan, default=float))
  else:
    print(report.table(plan))
  reason = report.advice(plan)
  if reason is not None:
    print(f"jaxrl-scale plan: {reason}", file=sys.stderr)
    return 1
  return 0
