"""Numbers as the forecasts print them, each compute with its unit (issue 67 item 7).

One formatter for every place a forecast prints: `jaxrl-scale fit`'s report (text.py), the
messages of a fit (forecast.py), the live forecast line (live.py) and the end-of-run summary
(pipeline/summary.py), so a compute reads the same in each. A compute carries the unit of
the column it was read from (`UNITS`: FLOPs, accelerator-hours, else the column's name).
"""

from __future__ import annotations

import math

# The unit of each compute column `jaxrl-scale fit --x` reads (another column: its name).
UNITS = {"flops": "FLOPs", "compute_hours": "h"}


def num(v: float | None, digits: int = 3) -> str:
  """Compact number: fixed for pass rates and exponents, scientific for large compute."""
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "-"
  if math.isinf(v):
    return "never" if v > 0 else "-inf"
  if v != 0 and (abs(v) >= 1e4 or abs(v) < 1e-2):
    return f"{v:.{max(digits - 1, 1)}e}"
  if abs(v) >= 100:
    return f"{v:.0f}"
  return f"{v:.{digits}f}" if abs(v) < 10 else f"{v:.1f}"


def unit_of(column: str | None) -> str:
  """The unit printed after a compute read from `column` (None: the default column)."""
  column = column or "compute_hours"
  return UNITS.get(column, f"({column})")


def at(v: float | None, unit: str, digits: int = 3) -> str:
  """A compute with its unit: `5.73e+11 FLOPs`, `2542 h`, `never`."""
  text = num(v, digits)
  return text if text in ("-", "never", "-inf") else f"{text} {unit}"
