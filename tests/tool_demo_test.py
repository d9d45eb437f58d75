"""benchmarks/demos/tool_demo.py's verdicts: each target met only when every seed meets it."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.demos import tool_demo  # pylint: disable=wrong-import-position


def _row(variant, seed, final, wall=200.0):
  return {"variant": variant, "seed": seed, "final": final, "wall_s": wall}


def test_targets_met_and_missed():
  good = [_row("tool", 0, 0.85), _row("no_tool", 0, 0.05),
          _row("tool", 1, 0.9), _row("no_tool", 1, 0.1)]
  assert all(ok for _, ok in tool_demo.check_targets(good))
  low = [_row("tool", 0, 0.85), _row("no_tool", 0, 0.05),
         _row("tool", 1, 0.79), _row("no_tool", 1, 0.1)]
  assert [ok for _, ok in tool_demo.check_targets(low)] == [False, True, True]
  slow = [_row("tool", 0, 0.85, wall=400), _row("no_tool", 0, 0.05)]
  assert [ok for _, ok in tool_demo.check_targets(slow)] == [True, False, True]
  close = [_row("tool", 0, 0.85), _row("no_tool", 0, 0.6)]
  assert [ok for _, ok in tool_demo.check_targets(close)] == [True, True, False]
  failed = [{"variant": "tool", "seed": 0, "wall_s": 10.0, "error": "exit 1"},
            _row("no_tool", 0, 0.0)]
  assert not any(ok for _, ok in tool_demo.check_targets(failed))


def test_the_no_tool_overrides_name_real_config_keys():
  from jaxrl_scale import config  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parents[1]
  cfg = config.load(root / tool_demo.CONFIG, list(tool_demo.NO_TOOL))
  assert cfg.env.name == "" and cfg.data.source.endswith("_answer")
