"""Staleness: how many policy versions behind the trainer each generated token is.

The sampler records, per token, the version of the weights that produced it (in-flight
updates change it mid-sequence). When the trainer at version v consumes a token of version
u, that token's staleness is v - u. PipelineRL-k bounds it by k (paper sec. 3.1 / A.11).

`summarize` gives the logged numbers: mean, max and a histogram with one bin per value
0..k and a last bin for anything above k (always empty: PipelineRL-k pauses admission so
that no group can get that old, see pipeline/generator.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def token_staleness(versions: Iterable[np.ndarray], trainer_version: int) -> np.ndarray:
  """Staleness of every token of the given version arrays, concatenated (int64)."""
  parts = [trainer_version - np.asarray(v, np.int64) for v in versions]
  parts = [p for p in parts if p.size]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int64)


def histogram(staleness: np.ndarray, max_staleness: int) -> np.ndarray:
  """Token counts for staleness 0, 1, ..., k and > k (length k + 2)."""
  s = np.asarray(staleness, np.int64)
  counts = np.bincount(np.clip(s, 0, max_staleness + 1), minlength=max_staleness + 2)
  return counts[:max_staleness + 2]


def summarize(staleness: np.ndarray, max_staleness: int, prefix: str = "staleness/"
              ) -> dict[str, float]:
  """mean, max and the histogram as fractions (hist_0 .. hist_k, hist_gt_k)."""
  s = np.asarray(staleness, np.int64)
  if s.size == 0:
    return {f"{prefix}mean": 0.0, f"{prefix}max": 0.0}
  out = {f"{prefix}mean": float(s.mean()), f"{prefix}max": float(s.max())}
  counts = histogram(s, max_staleness)
  total = float(s.size)
  for i in range(max_staleness + 1):
    out[f"{prefix}hist_{i}"] = counts[i] / total
  out[f"{prefix}hist_gt_{max_staleness}"] = counts[-1] / total
  return out


def oldest(versions: Sequence[int], trainer_version: int, prefix: str) -> dict[str, float]:
  """Max staleness among `versions` (e.g. the oldest token waiting in the queue)."""
  if not versions:
    return {f"{prefix}max": 0.0, f"{prefix}count": 0.0}
  return {f"{prefix}max": float(trainer_version - min(versions)),
          f"{prefix}count": float(len(versions))}
