"""A curve per domain: the sigmoids of a mixed-domain run's domains beside its overall fit.

A mixed-domain run (math + code, the paper's Table 1 row) logs `val/<domain>/pass_rate`,
`val/<domain>/num_prompts` and `val/<domain>/samples_per_prompt` next to `val/pass_rate`
on every eval. Each domain is its own curve -- `io.read_curve` on its column -- fitted by
the same `forecast.analyse` as the overall one: its R0 is its own step-0 eval and its fit is
weighted by its own eval size (a domain with fewer held-out prompts is noisier). The
forecasts are made at the overall fit's target compute, so the domains' rows compare.
"""

from __future__ import annotations

import dataclasses

from jaxrl_scale.errors import UserError
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io

# Seed stride between the domains of one run: each domain gets its own bootstrap draws.
_SEED_STRIDE = 613


@dataclasses.dataclass(frozen=True)
class DomainAnalysis:
  """One run's overall report and the report of each of its domains.

  Attributes:
    overall: the fit of the overall pass rate.
    domains: domain name -> its report, by name; empty for a single-domain file.
    errors: domain name -> why it was not fitted (e.g. too few evals of it).
  """
  overall: forecast.RunReport
  domains: dict[str, forecast.RunReport] = dataclasses.field(default_factory=dict)
  errors: dict[str, str] = dataclasses.field(default_factory=dict)

  def domains_dict(self) -> dict[str, dict]:
    """JSON of every domain: its report's `to_dict`, or {"error": why} where not fitted."""
    out = {d: r.to_dict() for d, r in self.domains.items()}
    out.update({d: {"error": e} for d, e in self.errors.items()})
    return dict(sorted(out.items()))


def find(paths: list[str], x_key: str = "compute_hours", y_key: str = "val/pass_rate"
         ) -> list[str]:
  """The domains every one of `paths` logs (pooled seeds need each domain in each file)."""
  found = [set(io.find_domains(p, x_key, y_key)) for p in paths]
  return sorted(set.intersection(*found)) if found else []


def read(paths: list[str], name: str, domain: str, x_key: str = "compute_hours",
         y_key: str = "val/pass_rate") -> io.Curve:
  """`domain`'s curve of one run (several paths: its seeds, pooled), named `name`."""
  key = io.domain_key(y_key, domain)
  seeds = [io.read_curve(p, x_key, key) for p in paths]
  if len(seeds) > 1:
    return io.pool(seeds, name)
  return dataclasses.replace(seeds[0], name=name)


def check_domain(paths: list[str], domain: str, x_key: str = "compute_hours",
                 y_key: str = "val/pass_rate") -> None:
  """Raises a one-line UserError when a file does not log `domain` (--domain NAME)."""
  for p in paths:
    have = io.find_domains(p, x_key, y_key)
    if domain not in have:
      listed = ", ".join(have) if have else "none: it has no val/<domain>/pass_rate columns"
      raise UserError(f"{p}: no domain {domain!r} (column '{io.domain_key(y_key, domain)}'); "
                      f"domains in the file: {listed}")


def options_for(options: forecast.AnalysisOptions, overall: forecast.RunReport
                ) -> forecast.AnalysisOptions:
  """The options of the domains' fits: the overall fit's target compute, and R0 and eval
  size from each domain's own columns (a given --r0 / --eval-size is the overall's)."""
  target = options.target_compute
  if target is None and options.backtest is None:
    target = overall.target_compute
  return dataclasses.replace(options, r0=None, eval_size=None, target_compute=target)


def analyse(paths: list[str], overall: forecast.RunReport,
            options: forecast.AnalysisOptions, x_key: str = "compute_hours",
            y_key: str = "val/pass_rate") -> DomainAnalysis:
  """Fits every domain of one run (see the module docstring).

  Args:
    paths: the run's metrics file(s) (several: seeds pooled into one curve per domain).
    overall: the run's overall report (its name and target compute are reused).
    options: the overall fit's options (its seed seeds the domains' bootstraps).
    x_key: compute column.
    y_key: the overall pass-rate column; a domain's is `io.domain_key(y_key, domain)`.

  Returns:
    The analysis; a domain with too few evals is in `errors`, not fatal.
  """
  base = options_for(options, overall)
  seed = overall.seed if overall.seed is not None else 0
  reports, errors = {}, {}
  for j, domain in enumerate(find(paths, x_key, y_key)):
    try:
      curve = read(paths, f"{overall.name}/{domain}", domain, x_key, y_key)
      report = forecast.analyse(curve, dataclasses.replace(
          base, seed=seed + _SEED_STRIDE * (j + 1)))
    except UserError as e:
      errors[domain] = str(e)
      continue
    if base.target_compute == overall.target_compute and options.target_compute is None:
      report = dataclasses.replace(report, target_source=overall.target_source)
    reports[domain] = report
  return DomainAnalysis(overall=overall, domains=reports, errors=errors)


def analyse_file(path: str, *, x_key: str = "compute_hours", y_key: str = "val/pass_rate",
                 **options) -> DomainAnalysis:
  """The overall fit of one metrics file and its domains' (`forecast.AnalysisOptions`
  keywords, e.g. n_boot=200, seed=0, target_compute=...)."""
  opts = forecast.AnalysisOptions(**options)
  overall = forecast.analyse(io.read_curve(path, x_key, y_key), opts)
  return analyse([path], overall, dataclasses.replace(opts, seed=overall.seed), x_key, y_key)


def plot_reports(analyses: list[DomainAnalysis]) -> list[forecast.RunReport]:
  """The curves to draw on one set of axes: every run's domains beside its overall fit,
  labelled by domain (by run/domain when several runs are drawn)."""
  single = len(analyses) == 1
  out = []
  for a in analyses:
    if not a.domains:
      out.append(a.overall)
      continue
    out.append(_renamed(a.overall, "all domains" if single else f"{a.overall.name} (all)"))
    for domain, r in a.domains.items():
      out.append(_renamed(r, domain) if single else r)
  return out


def _renamed(report: forecast.RunReport, name: str) -> forecast.RunReport:
  return dataclasses.replace(report, curve=dataclasses.replace(report.curve, name=name))
