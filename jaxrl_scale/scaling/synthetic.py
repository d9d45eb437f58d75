"""Synthetic scaling curves from the paper's fitted parameters, for tests, benchmarks, docs.

TABLE1 is the paper's Table 1 (arXiv 2510.13786, App. A.13): C_mid in GB200 GPU-hours, B,
A. The paper gives no R0 per row; 0.40 is the starting pass rate digitised from the 8B
curve of Fig. 1. The budgets are the paper's: 16k GPU-hours for the 8B leave-one-out style
runs (fit to 8k, extrapolate to 16k), 100k for the batch-2048 and 32k-length runs (Fig. 1,
fit to 50k), 45k for Scout.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from jaxrl_scale.scaling import curves


class Table1Row(NamedTuple):
  name: str
  c_mid: float
  b: float
  a: float
  budget: float  # compute of the run's final eval (GPU-hours)


TABLE1 = (
    Table1Row("ScaleRL", 2542, 1.92, 0.610, 16_000),
    Table1Row("ScaleRL-32k", 11272, 1.89, 0.645, 100_000),
    Table1Row("ScaleRL-8gen", 2542, 2.44, 0.585, 16_000),
    Table1Row("ScaleRL-24gen", 3054, 2.22, 0.590, 16_000),
    Table1Row("ScaleRL-32gen", 2936, 2.07, 0.595, 16_000),
    Table1Row("ScaleRL-Scout", 4242, 1.65, 0.710, 45_000),
    Table1Row("ScaleRL-bs512", 2818, 1.77, 0.605, 16_000),
    Table1Row("ScaleRL-bs2048", 10909, 1.70, 0.645, 100_000),
    Table1Row("ScaleRL-math+code (math)", 2896, 2.05, 0.595, 16_000),
    Table1Row("ScaleRL-math+code (code)", 1675, 1.09, 0.615, 16_000),
)
R0 = 0.40


def make_curve(row: Table1Row, *, n_points: int = 61, noise_sd: float = 0.01,
               seed: int = 0, r0: float = R0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Evenly spaced evals over [0, budget] with Gaussian noise (the step-0 eval included).

  Returns:
    (compute_N, noisy pass rate_N, noiseless pass rate_N); index 0 is the compute-0 eval.
  """
  compute = np.linspace(0.0, row.budget, n_points)
  clean = curves.sigmoid(compute, row.a, row.b, row.c_mid, r0)
  noisy = clean + np.random.default_rng(seed).normal(0.0, noise_sd, n_points)
  return compute, np.clip(noisy, 0.0, 1.0), clean


NOISE_KINDS = ("iid", "ar1", "binomial")


def simulate_evals(row: Table1Row, *, n_evals: int = 80, spacing: str = "linear",
                   noise: str = "iid", noise_sd: float = 0.01, rho: float = 0.5,
                   eval_size: int = 500, r0: float = R0, seed: int = 0,
                   drop: float = 0.0, drop_from: float = 2.0 / 3.0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A run's evals: a step-0 eval plus `n_evals` more up to the budget.

  Args:
    row: the curve's parameters.
    n_evals: evals after step 0.
    spacing: "linear" (every so many steps at a constant compute per step) or "log"
      (geometric from budget / 100, e.g. a run whose steps grow more expensive).
    noise: "iid" Gaussian, "ar1" Gaussian with lag-1 autocorrelation `rho` in eval order
      (the same held-out prompts every eval), or "binomial" (`eval_size` independent
      problems; noise_sd is then unused).
    noise_sd: marginal sd of the Gaussian kinds.
    rho: autocorrelation of "ar1".
    eval_size: problems x samples per problem of the "binomial" kind.
    r0: true pass rate at zero compute (the step-0 eval is noisy like every other).
    seed: PRNG seed.
    drop: a run that degrades late: from `drop_from` x budget on, the true pass rate falls
      linearly from the curve's value there by `drop` at the budget (0: the sigmoid).
    drop_from: where the decline starts, as a fraction of the budget.

  Returns:
    (compute_E, noisy pass rate_E, noiseless pass rate_E), E = n_evals + 1, index 0 is the
    step-0 eval at compute 0.
  """
  if spacing == "linear":
    compute = np.linspace(0.0, row.budget, n_evals + 1)
  elif spacing == "log":
    compute = np.concatenate([[0.0], np.geomspace(row.budget / 100.0, row.budget, n_evals)])
  else:
    raise ValueError(f"spacing must be 'linear' or 'log', got {spacing!r}")
  clean = curves.sigmoid(compute, row.a, row.b, row.c_mid, r0)
  if drop:
    start = drop_from * row.budget
    peak = float(curves.sigmoid(start, row.a, row.b, row.c_mid, r0))
    late = compute > start
    clean = np.where(late, peak - drop * (compute - start) / (row.budget - start), clean)
  rng = np.random.default_rng(seed)
  if noise == "iid":
    noisy = clean + rng.normal(0.0, noise_sd, clean.size)
  elif noise == "ar1":
    e = rng.normal(0.0, 1.0, clean.size)
    for t in range(1, e.size):
      e[t] = rho * e[t - 1] + np.sqrt(1.0 - rho * rho) * e[t]
    noisy = clean + noise_sd * e
  elif noise == "binomial":
    noisy = rng.binomial(eval_size, np.clip(clean, 0.0, 1.0)) / eval_size
  else:
    raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
  return compute, np.clip(noisy, 0.0, 1.0), clean


def demo_shape(seed: int, *, plateau: float = 0.95, noise_sd: float = 0.012,
               steps: int = 600, drop: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
  """The CPU demo run to 3x its budget, as a shape: evals every 10 steps, 0.40 at step 0,
  then straight up in log compute (0.47 at step 10, +0.36 a decade) until `plateau`
  (step ~215), flat after; `drop` > 0 loses that much linearly over steps 450..600.
  A sigmoid fitted before the plateau sees no saturation (A on its bound 1), and one fitted
  to the whole run overshoots the flat tail.

  Returns:
    (compute_E, noisy pass rate_E): compute is steps x 1e12 FLOPs; index 0 is step 0.
  """
  step = np.arange(0, steps + 1, 10)
  clean = np.minimum(0.47 + 0.36 * np.log10(np.maximum(step, 1) / 10), plateau)
  clean[0] = R0
  clean = clean - drop * np.clip((step - 450) / 150, 0.0, 1.0)
  y = clean + np.random.default_rng(seed).normal(0.0, noise_sd, step.size)
  return step * 1e12, np.clip(y, 0.0, 1.0)


def write_metrics_jsonl(path: str, compute, pass_rate, *, train_rows_per_eval: int = 2,
                        steps_per_eval: int = 100,
                        eval_size: tuple[int, int] | None = None) -> None:
  """Writes a metrics.jsonl like `jaxrl-scale train` does: train rows between evals.

  `eval_size` (problems, samples per problem) is logged with every eval, as the trainer's
  evaluator does.
  """
  compute = np.asarray(compute, np.float64)
  size = {} if eval_size is None else {"val/num_prompts": eval_size[0],
                                       "val/samples_per_prompt": eval_size[1]}
  with open(path, "w", encoding="utf-8") as f:
    for i, (c, r) in enumerate(zip(compute, pass_rate)):
      step = i * steps_per_eval
      f.write(json.dumps({"step": step, "compute_hours": float(c),
                          "val/pass_rate": float(r), **size}) + "\n")
      nxt = compute[i + 1] if i + 1 < compute.size else c
      for j in range(1, train_rows_per_eval + 1):
        frac = j / (train_rows_per_eval + 1)
        f.write(json.dumps({"step": step + int(frac * steps_per_eval),
                            "compute_hours": float(c + frac * (nxt - c)),
                            "train/loss": 0.0}) + "\n")
