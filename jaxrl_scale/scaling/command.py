"""`jaxrl-scale fit`: fit the sigmoid scaling curve to metrics files and forecast.

Only the standard library is imported at module level: `add_arguments` runs whenever the
CLI parser is built, and NumPy, SciPy and the fitter are paid for only when `fit` actually runs.
The whole `fit` path never imports JAX (tests/scaling/imports_test.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """Declares the `fit` flags."""
  parser.add_argument("metrics", nargs="*", metavar="METRICS",
                      help="metrics.jsonl, CSV or TensorBoard event file(s) / tb directories; "
                      "several runs are compared")
  parser.add_argument("--group", action="append", default=[], metavar="NAME=F1,F2,...",
                      help="pool several seeds of one recipe into one fit named NAME "
                      "(repeatable; the files need not be listed as METRICS too)")
  parser.add_argument("--x", default="compute_hours", help="compute column")
  parser.add_argument("--y", default="val/pass_rate", help="pass-rate column")
  parser.add_argument("--r0", type=float, default=None,
                      help="pass rate at zero compute (default: the step-0 eval, else fitted); "
                      "the overall curve's, or --domain's: other domains use their own "
                      "step-0 evals")
  parser.add_argument("--min-compute", type=float, default=0.0, metavar="C",
                      help="ignore points below this compute (the paper skips ~1 epoch)")
  parser.add_argument("--target", type=float, default=None, metavar="C",
                      help="forecast the pass rate at this compute (default: 2x the data)")
  parser.add_argument("--target-pass-rate", type=float, default=None, metavar="R",
                      help="also report the compute needed to reach this pass rate")
  parser.add_argument("--fit-fraction", "--backtest", dest="backtest", type=float,
                      default=None, metavar="FRAC",
                      help="backtest: fit on compute <= FRAC x max compute, forecast the "
                      "last point and report the error on the rest")
  parser.add_argument("--eval-size", default=None, metavar="NxK",
                      help="problems x samples per problem of every eval (e.g. 1000x16), "
                      "where the file does not log val/num_prompts and "
                      "val/samples_per_prompt; weights the fit by the binomial error "
                      "(the overall curve's, or --domain's; other domains use their own "
                      "val/<domain>/num_prompts x samples_per_prompt)")
  parser.add_argument("--domain", default=None, metavar="NAME",
                      help="fit only this domain of a mixed-domain run (its "
                      "val/NAME/pass_rate column); without it every domain is fitted "
                      "beside the overall curve")
  parser.add_argument("--plot", default=None, metavar="F.png", help="write a plot here")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.add_argument("--bootstrap", type=int, default=1000, metavar="K",
                      help="bootstrap refits for the intervals (0: none)")
  parser.add_argument("--level", type=float, default=0.95, help="interval level")
  parser.add_argument("--grid", choices=("auto", "paper"), default="auto",
                      help="auto: grid scaled to the data; paper: A 0.45..0.80, "
                      "C_mid 100..40000 GPU-hours")
  parser.add_argument("--seed", type=int, default=None,
                      help="bootstrap seed (default: fresh each call, printed with the "
                      "result; pass it back to reproduce the numbers)")


def _check_args(args) -> None:
  from jaxrl_scale.errors import UserError
  checks = [
      (args.r0 is None or 0.0 <= args.r0 <= 1.0, "--r0 must be in [0, 1]"),
      (args.min_compute >= 0.0, "--min-compute must be >= 0"),
      (args.target is None or args.target > 0.0, "--target must be > 0"),
      (args.target_pass_rate is None or 0.0 < args.target_pass_rate < 1.0,
       "--target-pass-rate must be in (0, 1)"),
      (args.backtest is None or 0.0 < args.backtest < 1.0,
       "--fit-fraction must be in (0, 1)"),
      (args.metrics or args.group, "give at least one metrics file (or --group)"),
      (0.0 < args.level < 1.0, "--level must be in (0, 1)"),
      (args.bootstrap >= 0, "--bootstrap must be >= 0"),
  ]
  for ok, message in checks:
    if not ok:
      raise UserError(message)


def parse_eval_size(text: str | None) -> float | None:
  """'1000x16' -> 16000.0, '500' -> 500.0; None stays None."""
  from jaxrl_scale.errors import UserError
  if text is None:
    return None
  try:
    parts = [float(p) for p in text.lower().split("x")]
  except ValueError:
    parts = []
  if not 1 <= len(parts) <= 2 or any(not p >= 1 for p in parts):
    raise UserError(f"--eval-size must look like 1000x16 (problems x samples), got {text!r}")
  return float(parts[0] * (parts[1] if len(parts) == 2 else 1.0))


def parse_groups(specs: list[str]) -> list[tuple[str, list[str]]]:
  """--group NAME=F1,F2 flags -> [(NAME, [F1, F2])]."""
  from jaxrl_scale.errors import UserError
  groups = []
  for spec in specs:
    name, sep, files = spec.partition("=")
    paths = [f for f in files.split(",") if f]
    if not sep or not name or not paths:
      raise UserError(f"--group must look like NAME=FILE1,FILE2, got {spec!r}")
    groups.append((name, paths))
  return groups


def read_curves(args):
  """The runs to fit: each METRICS file, then each --group pooled into one curve."""
  return read_sources(args)[0]


def read_sources(args):
  """(the runs' curves, each run's files): the files of a run are the seeds pooled into it.

  With --domain NAME every curve is that domain's pass rate, named RUN/NAME.
  """
  from jaxrl_scale.scaling import domains
  from jaxrl_scale.scaling import io
  sources = [[p] for p in args.metrics] + [paths for _, paths in parse_groups(args.group)]
  y_key = args.y
  if args.domain is not None:
    for paths in sources:
      domains.check_domain(paths, args.domain, args.x, args.y)
    y_key = io.domain_key(args.y, args.domain)
  curves = [io.read_curve(p, args.x, y_key) for p in args.metrics]
  for name, paths in parse_groups(args.group):
    seeds = [io.read_curve(p, args.x, y_key) for p in paths]
    curves.append(io.pool(seeds, name) if len(seeds) > 1 else
                  dataclasses.replace(seeds[0], name=name))
  if args.domain is not None:
    curves = [dataclasses.replace(c, name=f"{c.name}/{args.domain}") for c in curves]
  _dedupe_names(curves)
  return curves, sources


def run(args) -> int:
  """Runs `jaxrl-scale fit`; returns the exit status."""
  _check_args(args)
  eval_size = parse_eval_size(args.eval_size)
  from jaxrl_scale.scaling import compare as compare_lib
  from jaxrl_scale.scaling import fit as fit_lib
  from jaxrl_scale.scaling import forecast

  curves, sources = read_sources(args)
  from jaxrl_scale.scaling import bootstrap as boot_lib
  seed = boot_lib.resolve_seed(args.seed)
  options = forecast.AnalysisOptions(
      r0=args.r0, min_compute=args.min_compute, target_compute=args.target,
      target_pass_rate=args.target_pass_rate, backtest=args.backtest, eval_size=eval_size,
      n_boot=args.bootstrap, level=args.level, seed=seed,
      fit=fit_lib.FitOptions(grid=args.grid))
  if len(curves) > 1 and args.target is None and args.backtest is None:
    # One common target so the forecasts are comparable.
    last = max(float(c.compute.max()) for c in curves)
    options = dataclasses.replace(options, target_compute=2.0 * last)
  # Runs get different seeds: a shared seed would give them the same bootstrap draws.
  reports = [forecast.analyse(c, dataclasses.replace(options, seed=seed + 7919 * i))
             for i, c in enumerate(curves)]
  per_domain = None
  if args.domain is None:
    # A mixed-domain run: every domain's own sigmoid beside the overall one.
    from jaxrl_scale.scaling import domains
    per_domain = [domains.analyse(paths, r, dataclasses.replace(options, seed=r.seed),
                                  args.x, args.y) for paths, r in zip(sources, reports)]
    if not any(d.domains or d.errors for d in per_domain):
      per_domain = None
  comparison = None
  if len(reports) > 1:
    comparison = compare_lib.compare(reports, level=args.level, options=options.fit,
                                     seed=seed + 7919 * len(reports))
  if args.plot:
    from jaxrl_scale.scaling import plot
    drawn, title = reports, None
    if per_domain is not None:
      drawn = domains.plot_reports(per_domain)
      title = ", ".join(r.name for r in reports) + ": per domain"
    plot.plot_reports(drawn, args.plot, title=title, x_label=f"{args.x} (log scale)",
                      y_label=args.y)

  if args.json:
    runs = [r.to_dict() for r in reports]
    for i, run_dict in enumerate(runs):
      if args.domain is not None:
        run_dict["domain"] = args.domain
      elif per_domain is not None:
        run_dict["domains"] = per_domain[i].domains_dict()
    if comparison is None:
      obj = runs[0]
    else:
      obj = {"seed": seed, "runs": runs, "comparison": comparison.to_dict()}
    if args.plot:
      obj["plot"] = args.plot
    print(json.dumps(obj, indent=2, allow_nan=False))
  else:
    from jaxrl_scale.scaling import text
    print(text.render(reports, comparison, plot_path=args.plot, seed=seed,
                      domains=per_domain, x=args.x))
  sys.stdout.flush()
  return 0


def _dedupe_names(curves) -> None:
  seen: dict[str, int] = {}
  for i, c in enumerate(curves):
    n = seen.get(c.name, 0)
    seen[c.name] = n + 1
    if n:
      curves[i] = dataclasses.replace(c, name=f"{c.name}#{n + 1}")
