"""preempt.StopRequest: one signal seen by two threads, callbacks before either goes on."""

import signal
import threading

from jaxrl_scale import preempt


def test_a_second_request_returns_only_after_the_first_ones_callbacks_ran():
  # One SIGTERM reaches the watcher thread (wakeup fd) and the main thread's handler. When
  # the watcher wins, the main thread must not go on (e.g. into an eval) before the
  # callbacks told the generator to stop: that race let an eval finish after its signal.
  stop = preempt.StopRequest(grace_s=0)
  entered, release, ran = threading.Event(), threading.Event(), []

  def slow_callback(signum):
    entered.set()
    release.wait(10)
    ran.append(signum)

  stop.subscribe(slow_callback)
  watcher = threading.Thread(target=stop.request, args=(signal.SIGTERM,))
  watcher.start()
  assert entered.wait(10)
  timer = threading.Timer(0.2, release.set)
  timer.start()
  stop.request(signal.SIGTERM)  # the main thread's handler, while the callback still runs
  assert ran == [signal.SIGTERM]
  assert stop.is_set() and stop.signum == signal.SIGTERM
  watcher.join(10)
  timer.join(10)
  assert ran == [signal.SIGTERM]  # once, whichever thread asked first


def test_a_callback_may_ask_again_and_a_late_subscriber_is_called_at_once():
  stop = preempt.StopRequest(grace_s=0)
  calls = []

  def asks_again(signum):
    calls.append(signum)
    stop.request(signal.SIGINT)  # re-entrant: no deadlock, no second round

  stop.subscribe(asks_again)
  stop.request(signal.SIGTERM)
  assert calls == [signal.SIGTERM] and stop.signum == signal.SIGTERM
  late = []
  stop.subscribe(late.append)
  assert late == [signal.SIGTERM]


def test_map_until_stopped_keeps_order_raises_errors_and_stops():
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top

  stop = preempt.StopRequest(grace_s=0)
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    for p in (pool, None):
      assert preempt.map_until_stopped(lambda x: x * x, range(7), p, stop) == [
          x * x for x in range(7)]

      def bad(x):
        if x == 3:
          raise ValueError("verifier crashed")
        return x

      with pytest.raises(ValueError, match="verifier crashed"):
        preempt.map_until_stopped(bad, range(7), p, stop)
  # Without a pool the calls after the request never run.
  ran = []

  def one(x):
    ran.append(x)
    if x == 1:
      stop.request()
    return x

  with pytest.raises(preempt.Interrupted):
    preempt.map_until_stopped(one, range(5), None, stop)
  assert ran == [0, 1]
