"""Recipe comparison: several runs side by side, and the paper's shared-A efficiency test.

The paper (Sec. 4, Fig. 7) compares recipes whose asymptotes agree within the +-0.02 noise
margin by refitting every curve with A fixed at their mean and comparing the exponents B:
"if two methods achieve similar A values (within 0.02), the one with higher B when a refit
is done with the average of A values is at least as good in terms of efficient
scalability" (App. A.5).

Significance. Every run's bootstrap replicates (`forecast.analyse`) are refitted jointly:
in replicate k the shared A is the mean of the runs' replicate A's, and each run's
replicate data are refitted with A held there. P(B_i > B_j) is the share of replicates in
which run i's B beats run j's (runs are independent, so replicate k of one run pairs with
replicate k of another as well as with any other); P(A_i > A_j) likewise from the free
fits. A run is named most efficient only when its P(B > B_other) reaches the interval
level against every other run; otherwise there is no significant difference and
`most_efficient` is None. Two seeds of one recipe should therefore name no winner in about
1 - 2 (1 - level) of comparisons (benchmarks/forecast_coverage.py measures it).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import forecast


@dataclasses.dataclass(frozen=True)
class SharedFit:
  """One run refitted with A held at the shared value."""
  name: str
  b: float
  c_mid: float
  b_interval: tuple[float, float] | None
  well_determined: bool


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Shared-A refit of several runs, ranked by B, with pairwise probabilities.

  Attributes:
    p_b_greater / p_a_greater: {(i, j): P(B_i > B_j)} (resp. A) over the joint bootstrap,
      for every ordered pair of run names; empty without a bootstrap.
    level: the probability a winner must reach against every other run.
  """
  shared_a: float
  runs_in_mean: tuple[str, ...]
  shared: tuple[SharedFit, ...]
  similar_a: bool
  max_a_gap: float
  messages: tuple[str, ...]
  level: float = 0.95
  p_b_greater: dict = dataclasses.field(default_factory=dict)
  p_a_greater: dict = dataclasses.field(default_factory=dict)

  @property
  def ranking(self) -> tuple[str, ...]:
    """Runs by B at the shared A, highest first; ill-determined runs after all others."""
    order = sorted(self.shared, key=lambda s: (not s.well_determined, -s.b))
    return tuple(s.name for s in order)

  def _winner(self, probs: dict, candidates) -> str | None:
    names = [s.name for s in self.shared]
    for c in candidates:
      if probs and all(probs[(c, o)] >= self.level for o in names if o != c):
        return c
    return None

  @property
  def most_efficient(self) -> str | None:
    """The well-determined run whose B beats every other with P >= level, if any."""
    well = {s.name for s in self.shared if s.well_determined}
    return self._winner(self.p_b_greater, [n for n in self.ranking[:1] if n in well])

  @property
  def higher_asymptote(self) -> str | None:
    """The run whose A beats every other with P >= level, if any."""
    return self._winner(self.p_a_greater, [s.name for s in self.shared])

  def to_dict(self) -> dict:
    pairs = lambda probs: [{"run": i, "other": j, "probability": p}
                           for (i, j), p in probs.items()]
    return {
        "shared_A": self.shared_a,
        "runs_in_mean": list(self.runs_in_mean),
        "A_within_paper_margin": self.similar_a,
        "max_A_gap": self.max_a_gap,
        "A_paper_margin": boot_lib.PAPER_A_MARGIN,
        "shared_A_fits": [
            {"run": s.name, "B": s.b, "C_mid": s.c_mid,
             "B_interval": None if s.b_interval is None else list(s.b_interval),
             "well_determined": s.well_determined}
            for s in self.shared],
        "ranking_by_B": list(self.ranking),
        "P_B_greater": pairs(self.p_b_greater),
        "P_A_greater": pairs(self.p_a_greater),
        "level": self.level,
        "most_efficient": self.most_efficient,
        "higher_asymptote": self.higher_asymptote,
        "messages": list(self.messages),
    }


def _pairwise(values: dict[str, np.ndarray]) -> dict:
  return {(i, j): float(np.mean(values[i] > values[j]))
          for i, j in itertools.permutations(values, 2)}


def compare(reports: list[forecast.RunReport], *, level: float = 0.95,
            options: fit_lib.FitOptions = fit_lib.FitOptions(), lm_steps: int = 40
            ) -> Comparison:
  """Refits every run with the mean A of the well-determined runs and compares B.

  Args:
    reports: analysed runs (at least two, with distinct names); their bootstrap replicates
      (`forecast.AnalysisOptions.n_boot` > 0, the same for all) give the probabilities.
    level: interval level, and the probability a winner must reach.
    options: fitter settings (the grid collapses to C_mid only, A being fixed).
    lm_steps: Levenberg-Marquardt steps per replicate refit.

  Returns:
    The comparison, with the runs ranked by B at the shared A.
  """
  if len(reports) < 2:
    raise ValueError("compare needs at least two runs")
  trusted = [r for r in reports if r.well_determined] or list(reports)
  messages = []
  if len(trusted) < len(reports):
    left_out = [r.name for r in reports if not r.well_determined]
    messages.append("not well determined, left out of the mean A: " + ", ".join(left_out))
  elif not any(r.well_determined for r in reports):
    messages.append("no run is well determined: the shared-A comparison is indicative only")
  shared_a = float(np.mean([r.sigmoid.a for r in trusted]))
  gaps = [abs(p.sigmoid.a - q.sigmoid.a) for p, q in itertools.combinations(trusted, 2)]
  max_gap = float(max(gaps)) if gaps else 0.0
  similar = max_gap <= boot_lib.PAPER_A_MARGIN
  if not similar:
    messages.append(
        f"A differs by up to {max_gap:.3f} (> {boot_lib.PAPER_A_MARGIN} noise margin): the "
        "runs differ in asymptote, so compare A first; B at a shared A is secondary")

  sizes = {None if r.replicates is None else r.replicates.y_KN.shape[0] for r in reports}
  joint = len(sizes) == 1 and None not in sizes
  if not joint:
    messages.append("no joint bootstrap (run with --bootstrap > 0): no probabilities, so "
                    "no run is named most efficient")
  a_K = None
  if joint:
    a_K = np.mean([r.samples.a_K for r in trusted], axis=0)
  shared, b_K, a_free = [], {}, {}
  for r in reports:
    x, y, w = r.curve.compute, r.curve.pass_rate, r.weights
    r0 = None if r.r0_source == "fitted" else r.sigmoid.r0
    refit = fit_lib.fit_sigmoid(x, y, r0, weights=w, options=options, a_fixed=shared_a)
    b_band = None
    if joint:
      samples = boot_lib.refit(refit, r.replicates, a_K=a_K, lm_steps=lm_steps)
      b_K[r.name], a_free[r.name] = samples.b_K, r.samples.a_K
      b_band = samples.interval("b", level)
    shared.append(SharedFit(name=r.name, b=refit.b, c_mid=refit.c_mid, b_interval=b_band,
                            well_determined=r.well_determined))
  result = Comparison(shared_a=shared_a, runs_in_mean=tuple(r.name for r in trusted),
                      shared=tuple(shared), similar_a=similar, max_a_gap=max_gap,
                      messages=tuple(messages), level=level,
                      p_b_greater=_pairwise(b_K) if joint else {},
                      p_a_greater=_pairwise(a_free) if joint else {})
  if joint and result.most_efficient is None:
    best = result.ranking[0]
    worst_p = min(result.p_b_greater[(best, o)] for o in b_K if o != best)
    result = dataclasses.replace(result, messages=result.messages + (
        f"no significant difference in B at the shared A: the highest, {best}, beats the "
        f"others with P >= {worst_p:.2f} only (< {level:.2f})",))
  return result
