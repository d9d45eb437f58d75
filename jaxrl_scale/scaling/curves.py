"""The two compute-performance curve families of the ScaleRL paper (arXiv 2510.13786).

Sigmoid (Eq. 1):   R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B),   0 <= A <= 1, B > 0
Power law (A.4):   R(C) = A - D / C^B

C is training compute (the paper: GB200 GPU-hours; here whatever unit the metrics stream
uses, e.g. accelerator-hours) and R the mean validation pass rate. All functions are NumPy
float64 (plots, forecasts, bootstrap replicates).
"""

from __future__ import annotations

import numpy as np
from scipy import special


def sigmoid(compute, a, b, c_mid, r0) -> np.ndarray:
  """Pass rate predicted by the sigmoidal curve at `compute` (NumPy, float64).

  Written as a logistic in log-compute, (C_mid / C)^B = exp(-B (log C - log C_mid)), so it
  neither overflows for C << C_mid nor divides by zero: C = 0 gives exactly R0.

  Args:
    compute: training compute, >= 0.
    a: asymptotic pass rate A.
    b: scaling exponent B (> 0).
    c_mid: compute at which half of the gain A - R0 is reached.
    r0: pass rate at zero compute.

  Returns:
    R(compute), shaped like the broadcast inputs.
  """
  compute = np.asarray(compute, np.float64)
  positive = compute > 0
  with np.errstate(divide="ignore"):
    log_c = np.log(np.where(positive, compute, 1.0))
  frac = np.where(positive, special.expit(b * (log_c - np.log(c_mid))), 0.0)
  return r0 + (a - r0) * frac


def power_law(compute, a, d, b) -> np.ndarray:
  """Pass rate predicted by the power law R = A - D / C^B (compute > 0; NumPy)."""
  with np.errstate(divide="ignore"):
    return a - d * np.power(np.asarray(compute, np.float64), -b)


def compute_to_reach(rate, a, b, c_mid, r0):
  """Compute at which the sigmoid reaches pass rate `rate` (inverse of `sigmoid`).

  Solving R = R0 + (A - R0) / (1 + (C_mid / C)^B) for C gives
  C = C_mid / ((A - R0) / (R - R0) - 1)^(1 / B). A rate at or beyond the asymptote is never
  reached (inf); a rate at or behind R0 needs no compute (0).

  Works on NumPy arrays (bootstrap samples) and scalars; returns NumPy float64.
  """
  rate, a, b, c_mid, r0 = (np.asarray(v, dtype=np.float64) for v in (rate, a, b, c_mid, r0))
  gain = a - r0
  need = rate - r0
  with np.errstate(divide="ignore", invalid="ignore"):
    frac = need / gain  # fraction of the total gain the target asks for
    ratio = 1.0 / frac - 1.0
    out = c_mid * np.power(ratio, -1.0 / b)
  out = np.where(frac >= 1.0, np.inf, out)
  out = np.where(frac <= 0.0, 0.0, out)
  return out
