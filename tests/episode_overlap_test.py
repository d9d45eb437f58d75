"""benchmarks/sampler/episode_overlap.py on a tiny run: the sleeping and the instant tool give the
same episodes (same tokens, same calls), so the ratio compares equal work. No timing is
judged here (the benchmark prints its ratio; a loaded machine must pass this test)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.sampler import episode_overlap  # pylint: disable=wrong-import-position


@pytest.mark.slow  # 17 s on 2 cores; the overlap itself is tests/generation/episodes_test.py's
def test_quick_run_compares_equal_work():
  res = episode_overlap.run(episode_overlap.parse_args(["--quick"]))
  assert res["same_tokens"]
  runs = res["runs"]
  assert len(runs) == 2 and {r["sleep_s"] for r in runs} == {0.0, 0.05}
  assert len({r["model_tokens"] for r in runs}) == 1 and len({r["tool_calls"] for r in runs}) == 1
  # Episodes of up to 3 turns: a call after each turn but the last (fewer when truncated).
  assert 0 < runs[0]["tool_calls"] <= 2 * res["sequences"]
  assert runs[1]["wall_s"] >= 0.05  # the sleeping run waited for at least one call
  assert res["ratio"] > 0 and res["serial_bound"] > 0
  assert "ratio (sleeping / instant)" in episode_overlap.render(res)


def test_bad_flags_are_one_line():
  with pytest.raises(SystemExit):
    episode_overlap.parse_args(["--turns", "0"])
