"""Aggregations on a hand-built ragged batch, with numbers worked out by hand."""

import numpy as np
import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import aggregation

# Two prompts x two completions x three tokens. Completion lengths 3, 1 | 2, 0; the
# 9s sit at masked positions and must never show up.
MASK = np.array([[[1, 1, 1], [1, 0, 0]], [[1, 1, 0], [0, 0, 0]]], np.float32)
LOSS = np.array([[[1, 2, 3], [4, 9, 9]], [[5, 7, 9], [9, 9, 9]]], np.float32)
ONES = np.ones((2, 2), np.float32)

CASES = {
    # (weights, {aggregation: (expected loss, expected unit count)})
    "all kept": (ONES, {
        "token_avg": ((1 + 2 + 3 + 4 + 5 + 7) / 6, 6),
        "sample_avg": ((2 + 4 + 6) / 3, 3),  # token means 2, 4, 6; empty slot not counted
        "prompt_avg": ((10 / 4 + 12 / 2) / 2, 2),
    }),
    "prompt 1 filtered": (np.array([[1, 1], [0, 0]], np.float32), {
        "token_avg": (10 / 4, 4),
        "sample_avg": ((2 + 4) / 2, 2),
        "prompt_avg": (10 / 4, 1),
    }),
    "one completion dropped": (np.array([[0, 1], [1, 1]], np.float32), {
        "token_avg": ((4 + 5 + 7) / 3, 3),
        "sample_avg": ((4 + 6) / 2, 2),
        "prompt_avg": ((4 / 1 + 12 / 2) / 2, 2),
    }),
    "fractional weights": (np.array([[1, 0.5], [1, 1]], np.float32), {
        "token_avg": ((6 + 0.5 * 4 + 12) / 5.5, 5.5),  # 3 + 0.5 * 1 + 2 tokens
        "sample_avg": ((2 + 0.5 * 4 + 6) / 2.5, 2.5),
        "prompt_avg": (((6 + 0.5 * 4) / 3.5 + 12 / 2) / 2, 2),
    }),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["token_avg", "sample_avg", "prompt_avg"])
def test_hand_computed(case, name):
  weight, expected = CASES[case]
  want_loss, want_units = expected[name]
  assert float(aggregation.denominator(name, MASK, weight)) == pytest.approx(want_units)
  got = aggregation.aggregate(name, LOSS, MASK, weight)
  assert float(got) == pytest.approx(want_loss, rel=1e-6)


@pytest.mark.parametrize("name", ["token_avg", "sample_avg", "prompt_avg"])
def test_prompt_slices_sum_to_the_whole(name):
  total = aggregation.denominator(name, MASK, ONES)
  parts = [aggregation.aggregate(name, LOSS[p:p + 1], MASK[p:p + 1], ONES[p:p + 1], total)
           for p in range(2)]
  whole = aggregation.aggregate(name, LOSS, MASK, ONES)
  assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-6)


def test_aggregations_differ_on_ragged_batches():
  # Guard against a mix-up that the per-name numbers would also catch: on this batch the
  # three rules genuinely disagree.
  values = {n: float(aggregation.aggregate(n, LOSS, MASK, ONES))
            for n in ("token_avg", "sample_avg", "prompt_avg")}
  assert len({round(v, 4) for v in values.values()}) == 3


def test_no_units_gives_zero_not_nan():
  zero = np.zeros((2, 2), np.float32)
  for name in ("token_avg", "sample_avg", "prompt_avg"):
    assert float(aggregation.aggregate(name, LOSS, MASK, zero)) == 0.0


def test_unknown_name():
  with pytest.raises(UserError, match="rl.aggregation: unknown aggregation 'sample_mean'"):
    aggregation.get_aggregation("sample_mean")
