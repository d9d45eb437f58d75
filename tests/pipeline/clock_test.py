import time

import jax
import jax.numpy as jnp
import pytest

from jaxrl_scale.pipeline import clock as clock_lib


def test_eval_and_checkpoint_time_is_not_compute():
  clock = clock_lib.RLClock(num_devices=3600, start_hours=2.0)  # 1 hour per second
  assert clock.hours == 2.0  # not started: nothing counts
  clock.start()
  with clock.excluded("eval"):
    time.sleep(0.2)
    inside = clock.hours
  with clock.excluded("checkpoint"):
    with clock.excluded("eval"):  # nested: counted once
      time.sleep(0.1)
  hours = clock.hours
  clock.stop()
  assert clock.excluded_s == {"eval": 0.0, "checkpoint": 0.0, "compile": 0.0}  # reset
  stopped = clock.hours
  time.sleep(0.05)
  assert clock.hours == stopped  # frozen once stopped
  # Only the sleeps' surroundings counted: far less than their 0.3 s.
  assert 2.0 <= inside <= hours < 2.0 + 0.15
  with pytest.raises(ValueError, match="unknown excluded time"):
    with clock.excluded("lunch"):
      pass


def test_compile_time_is_subtracted():
  clock = clock_lib.RLClock(num_devices=1).start()
  try:
    n = 40  # a program with a fresh shape: traced, lowered and compiled now
    jax.jit(lambda x: jnp.tanh(x @ x).sum())(jnp.ones((n, n + 1)) @ jnp.ones((n + 1, n)))
    compiled = clock.excluded_s["compile"]
  finally:
    clock.stop()
  assert compiled > 0


def test_hours_never_go_back():
  clock = clock_lib.RLClock(num_devices=1).start()
  try:
    first = clock.hours
    clock._on_duration(clock_lib.COMPILE_EVENTS[-1], 100.0)  # pylint: disable=protected-access
    assert clock.hours == first  # a compile that ended subtracts, but never below a reading
  finally:
    clock.stop()
