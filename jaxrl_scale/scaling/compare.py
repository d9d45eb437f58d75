"""Recipe comparison: several runs side by side, and the paper's shared-A efficiency test.

The paper (Sec. 4, Fig. 7) compares recipes whose asymptotes agree within the +-0.02 noise
margin by refitting every curve with A fixed at their mean and comparing the exponents B:
"if two methods achieve similar A values (within 0.02), the one with higher B when a refit
is done with the average of A values is at least as good in terms of efficient
scalability" (App. A.5).
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
  """Shared-A refit of several runs, ranked by B (most compute-efficient first)."""
  shared_a: float
  runs_in_mean: tuple[str, ...]
  shared: tuple[SharedFit, ...]
  similar_a: bool
  max_a_gap: float
  messages: tuple[str, ...]

  @property
  def ranking(self) -> tuple[str, ...]:
    """Runs by B at the shared A, highest first; ill-determined runs after all others."""
    order = sorted(self.shared, key=lambda s: (not s.well_determined, -s.b))
    return tuple(s.name for s in order)

  @property
  def most_efficient(self) -> str | None:
    """The well-determined run with the highest B at the shared A, if any."""
    best = [s for s in self.shared if s.name == self.ranking[0] and s.well_determined]
    return best[0].name if best else None

  def to_dict(self) -> dict:
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
        "most_efficient": self.most_efficient,
        "messages": list(self.messages),
    }


def compare(reports: list[forecast.RunReport], *, n_boot: int = 1000, seed: int = 0,
            level: float = 0.95, options: fit_lib.FitOptions = fit_lib.FitOptions()
            ) -> Comparison:
  """Refits every run with the mean A of the well-determined runs and compares B.

  Args:
    reports: analysed runs (at least two).
    n_boot: bootstrap refits per run for the interval on B (0: none).
    seed: PRNG seed.
    level: interval level.
    options: fitter settings (the grid collapses to C_mid only, A being fixed).

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

  shared = []
  for r in reports:
    x, y, w = r.curve.compute, r.curve.pass_rate, r.fit_mask.astype(np.float64)
    r0 = None if r.r0_source == "fitted" else r.sigmoid.r0
    refit = fit_lib.fit_sigmoid(x, y, r0, weights=w, options=options, a_fixed=shared_a)
    b_band = None
    if n_boot > 0:
      samples = boot_lib.bootstrap_sigmoid(x, y, refit, weights=w, n_boot=n_boot, seed=seed)
      b_band = samples.interval("b", level)
    shared.append(SharedFit(name=r.name, b=refit.b, c_mid=refit.c_mid, b_interval=b_band,
                            well_determined=r.well_determined))
  return Comparison(shared_a=shared_a, runs_in_mean=tuple(r.name for r in trusted),
                    shared=tuple(shared), similar_a=similar, max_a_gap=max_gap,
                    messages=tuple(messages))
