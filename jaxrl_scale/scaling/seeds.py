"""Seed-to-seed training variance of a recipe's A and B, for recipe comparisons.

A run's bootstrap replicates (`bootstrap.py`) hold eval noise only: they answer "how well do
these evals pin down this run's curve", not "how far would another seed of the same recipe
land". Two seeds of one recipe differ in A by about 0.01-0.02 (paper App. A.5: +-0.015 over
three identical runs; the paper treats |dA| <= 0.02 as noise), several times the eval-noise
sd of a fitted A (~0.004 on 80 evals of sd 0.01). A comparison on eval noise alone therefore
calls seeds of one recipe different (7 of 10 simulated pairs before this module).

The model is a random-effects (hierarchical) one: seed s of a recipe has A_s = A + a_s and
log B_s = log B + b_s, with a_s ~ N(0, tau_A^2), b_s ~ N(0, tau_B^2). What a comparison estimates is
the recipe's A and B from the mean over its n seeds (the pooled fit), whose seed error has
variance tau^2 / n. Each recipe's replicates are widened by independent normal draws of that
sd (`widen`), on top of their eval noise. Normal and independent because with 2-3 seeds a
covariance or a tail shape cannot be estimated.

- tau_A. With several seeds (`jaxrl-scale fit --group`), each seed is also fitted on its
  own; the spread of those A's, less the eval-noise part (n times the pooled replicates'
  variance, as one seed has 1/n of the data), estimates tau_A^2 by moments. With 2-3 seeds
  that estimate has 1-2 degrees of freedom and is often 0, so it is combined with a prior
  worth the paper's own three runs (2 degrees of freedom): the scaled-inverse-chi-square
  posterior mean (2 * 0.02^2 + (n - 1) * est) / (2 + n - 1). The prior sd is the paper's
  0.02 margin rather than its measured 0.015: the upper end of what seeds show, so a
  comparison of single runs does not name false winners when seeds are noisier than the
  paper's. A single run (n = 1) gets the prior alone.
- tau_B, on log B (so a relative sd: seeds of one recipe differ in B by a share of it). The
  paper gives no error margin for B ("difficult", App. A.5), but its Table 1 has four runs
  of one recipe that it calls "essentially unchanged" (8, 16, 24, 32 generations per
  prompt, batch fixed: B 2.44, 1.92, 2.22, 2.07): their sd of log B is 0.10. That is the
  prior, worth PRIOR_DF degrees of freedom as for A, combined with a group's moment
  estimate the same way; a single run gets the prior alone. Without it one run had no seed
  spread of B at all and a group's estimate was clipped at 0 (often, with 2-3 seeds), so
  two seeds of one recipe (seed sd 0.01 in A, 10% in B) were named "most efficient" in
  28 of 200 simulated pairs; with it, in 9 of those 200 and 8 of another 200
  (benchmarks/forecast/forecast_coverage.py section 4, case "ab").
  Probabilities on B use the free fits' B (A not fixed), not B at the shared A: refitted at
  an A 0.02 below its own, ScaleRL's curve gives B 2.73 instead of 1.92 (and 1.34 at 0.02
  above), so at a shared A a seed's A offset would pass into B twenty-fold and swamp any
  difference in efficiency; the free B does not move with an A offset. So a winner is
  named only past both seed noises: the most efficient run's free B beats the others with
  the seed spread of B drawn in, the higher asymptote's A with that of A. The ranking stays
  the paper's (B at the shared A).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import forecast

# Prior sd of one seed's A offset, of its log B, and their weight in degrees of freedom
# (see the docstring).
PRIOR_A_SD = boot_lib.PAPER_A_MARGIN
PRIOR_LOG_B_SD = 0.10
PRIOR_DF = 2.0


@dataclasses.dataclass(frozen=True)
class SeedVariance:
  """Seed-to-seed variance of one compared run (a single seed or a pooled group).

  Attributes:
    name: the run.
    n_seeds: seeds pooled in the run (1 for a single file).
    source: "prior" (one seed: the priors alone) or "seeds" (estimated from the group,
      combined with the priors).
    tau_a / tau_b: between-seed sd of one seed's A / log B (tau_b: B's relative sd).
    a_sd / b_sd: sd added to the run's A / log B replicates: tau / sqrt(n_seeds).
    a_per_seed / b_per_seed: each seed fitted on its own (empty for one seed).
  """
  name: str
  n_seeds: int
  source: str
  tau_a: float
  tau_b: float
  a_sd: float
  b_sd: float
  a_per_seed: tuple[float, ...] = ()
  b_per_seed: tuple[float, ...] = ()

  def to_dict(self) -> dict:
    return {"run": self.name, "n_seeds": self.n_seeds, "source": self.source,
            "between_seed_sd_A": self.tau_a, "between_seed_sd_log_B": self.tau_b,
            "added_sd_A": self.a_sd, "added_sd_log_B": self.b_sd,
            "A_per_seed": list(self.a_per_seed), "B_per_seed": list(self.b_per_seed)}

  def describe(self) -> str:
    """One line for the human report."""
    if self.n_seeds == 1:
      return (f"{self.name}: one run: prior seed sd of A {PRIOR_A_SD} (the paper's noise "
              f"margin), of B {PRIOR_LOG_B_SD:.0%} (the paper's runs of one recipe); one "
              "run shows no seed spread: pool seeds with --group")
    per = lambda v: "/".join(f"{x:.3f}" for x in v)
    return (f"{self.name}: {self.n_seeds} seeds, A per seed {per(self.a_per_seed)}, B per "
            f"seed {per(self.b_per_seed)}; between-seed sd A {self.tau_a:.3f}, B "
            f"{self.tau_b:.1%} (with the priors {PRIOR_A_SD}, {PRIOR_LOG_B_SD:.0%}); added to "
            f"the mean's replicates: A {self.a_sd:.4f}, B {self.b_sd:.1%}")


def per_seed_fits(report: forecast.RunReport, options: fit_lib.FitOptions
                  ) -> list[fit_lib.SigmoidFit]:
  """Each seed of a pooled run fitted on its own points (same mask, weights and R0)."""
  series = report.curve.series
  w = report.weights if report.weights is not None else report.fit_mask.astype(np.float64)
  r0 = None if report.r0_source == "fitted" else report.sigmoid.r0
  fits = []
  for s in np.unique(series):
    w_s = np.where(series == s, w, 0.0)
    if int(np.sum(w_s > 0)) < forecast.MIN_POINTS:
      continue
    fits.append(fit_lib.fit_sigmoid(report.curve.compute, report.curve.pass_rate, r0,
                                    weights=w_s, options=options))
  return fits


# B > 0 always in a fit; the floor only guards the log.
_B_FLOOR = 1e-6


def _between(values, within_var: float) -> float:
  """Moment estimate of the between-seed variance: sample variance less the eval noise."""
  return max(float(np.var(values, ddof=1)) - within_var, 0.0)


def estimate(report: forecast.RunReport,
             options: fit_lib.FitOptions = fit_lib.FitOptions()) -> SeedVariance:
  """The seed variance of a run's A and B (see the module docstring)."""
  fits = per_seed_fits(report, options) if report.curve.n_series > 1 else []
  n = len(fits)
  if n < 2:
    return SeedVariance(name=report.name, n_seeds=1, source="prior", tau_a=PRIOR_A_SD,
                        tau_b=PRIOR_LOG_B_SD, a_sd=PRIOR_A_SD, b_sd=PRIOR_LOG_B_SD)
  a_s = np.array([f.a for f in fits])
  b_s = np.array([f.b for f in fits])
  # One seed has 1/n of the pooled data: n times the pooled replicates' variance.
  var_a = var_b = 0.0
  if report.samples is not None:
    var_a = n * float(np.var(report.samples.a_K))
    var_b = n * float(np.var(np.log(np.maximum(report.samples.b_K, _B_FLOOR))))
  posterior = lambda prior_sd, est: ((PRIOR_DF * prior_sd ** 2 + (n - 1) * est)
                                     / (PRIOR_DF + n - 1))
  tau_a2 = posterior(PRIOR_A_SD, _between(a_s, var_a))
  tau_b2 = posterior(PRIOR_LOG_B_SD, _between(np.log(np.maximum(b_s, _B_FLOOR)), var_b))
  return SeedVariance(name=report.name, n_seeds=n, source="seeds",
                      tau_a=float(np.sqrt(tau_a2)), tau_b=float(np.sqrt(tau_b2)),
                      a_sd=float(np.sqrt(tau_a2 / n)), b_sd=float(np.sqrt(tau_b2 / n)),
                      a_per_seed=tuple(float(v) for v in a_s),
                      b_per_seed=tuple(float(v) for v in b_s))


def widen(a_K, b_K, sv: SeedVariance, rng: np.random.Generator
          ) -> tuple[np.ndarray, np.ndarray]:
  """A and B replicates with the run's seed error drawn on top of their eval noise (B's
  as a factor exp(N(0, b_sd)), a relative error)."""
  a_K = np.asarray(a_K, np.float64)
  b_K = np.asarray(b_K, np.float64)
  return (a_K + sv.a_sd * rng.standard_normal(a_K.shape),
          b_K * np.exp(sv.b_sd * rng.standard_normal(b_K.shape)))
