import numpy as np
import pytest

from jaxrl_scale.pipeline import staleness


def test_token_staleness_and_histogram():
  s = staleness.token_staleness([np.array([5, 5, 6]), np.array([], np.int32),
                                 np.array([2])], trainer_version=7)
  np.testing.assert_array_equal(s, [2, 2, 1, 5])
  np.testing.assert_array_equal(staleness.histogram(s, max_staleness=2), [0, 1, 2, 1])


def test_summarize():
  out = staleness.summarize(np.array([0, 0, 1, 3]), max_staleness=2, prefix="s/")
  assert out["s/mean"] == pytest.approx(1.0)
  assert out["s/max"] == 3.0
  assert [out[f"s/hist_{i}"] for i in range(3)] == [0.5, 0.25, 0.0]
  assert out["s/hist_gt_2"] == 0.25
  assert staleness.summarize(np.array([], np.int64), 2) == {"staleness/mean": 0.0,
                                                            "staleness/max": 0.0}


def test_oldest():
  assert staleness.oldest([4, 2, 5], 6, "q/") == {"q/max": 4.0, "q/count": 3.0}
  assert staleness.oldest([], 6, "q/") == {"q/max": 0.0, "q/count": 0.0}
