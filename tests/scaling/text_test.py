"""Tests for the human-readable number formatting of `jaxrl-scale fit`."""

import math

from jaxrl_scale.scaling import text


def test_num_formats_rates_exponents_and_compute():
  assert text.num(0.61234) == "0.612"
  assert text.num(1.5) == "1.500"
  assert text.num(25.25) == "25.2"
  assert text.num(2998.4) == "2998"
  assert text.num(16000.0) == "1.60e+04"
  assert text.num(0.0012) == "1.20e-03"
  assert text.num(0.0) == "0.000"
  assert text.num(math.inf) == "never"
  assert text.num(None) == "-"


def test_span_and_table():
  assert text.span(None) == ""
  assert text.span((0.5, math.inf)) == "[0.500, never]"
  out = text.table([["a", "bb"], ["ccc", "d"]])
  assert out.splitlines() == ["  a    bb", "  ccc  d"]
