"""Tests for the number and unit formatting every forecast prints with."""

import math

from jaxrl_scale.scaling import units


def test_num_formats_rates_exponents_and_compute():
  assert units.num(0.61234) == "0.612"
  assert units.num(1.5) == "1.500"
  assert units.num(25.25) == "25.2"
  assert units.num(2998.4) == "2998"
  assert units.num(16000.0) == "1.60e+04"
  assert units.num(0.0012) == "1.20e-03"
  assert units.num(0.0) == "0.000"
  assert units.num(math.inf) == "never"
  assert units.num(None) == "-"


def test_a_compute_carries_its_columns_unit():
  assert [units.unit_of(c) for c in ("flops", "compute_hours", None, "gpu_hours")] == [
      "FLOPs", "h", "h", "(gpu_hours)"]
  assert units.at(5.73e11, "FLOPs") == "5.73e+11 FLOPs"
  assert units.at(0.0588, "h") == "0.059 h"
  assert units.at(math.inf, "h") == "never" and units.at(None, "h") == "-"
