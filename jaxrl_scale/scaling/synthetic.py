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


def write_metrics_jsonl(path: str, compute, pass_rate, *, train_rows_per_eval: int = 2,
                        steps_per_eval: int = 100) -> None:
  """Writes a metrics.jsonl like `jaxrl-scale train` does: train rows between evals."""
  compute = np.asarray(compute, np.float64)
  with open(path, "w", encoding="utf-8") as f:
    for i, (c, r) in enumerate(zip(compute, pass_rate)):
      step = i * steps_per_eval
      f.write(json.dumps({"step": step, "compute_hours": float(c),
                          "val/pass_rate": float(r)}) + "\n")
      nxt = compute[i + 1] if i + 1 < compute.size else c
      for j in range(1, train_rows_per_eval + 1):
        frac = j / (train_rows_per_eval + 1)
        f.write(json.dumps({"step": step + int(frac * steps_per_eval),
                            "compute_hours": float(c + frac * (nxt - c)),
                            "train/loss": 0.0}) + "\n")
