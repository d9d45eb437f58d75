import io

from jaxrl_scale.pipeline import progress


def test_duration():
  assert progress.duration(42.4) == "42s"
  assert progress.duration(185) == "3m05s"
  assert progress.duration(3720) == "1h02m"


def test_step_lines_show_the_roles_and_the_last_eval():
  out = io.StringIO()
  p = progress.Progress(total_steps=20, log_every=5, stream=out)
  p.step(0, {"val/pass_rate": 0.25, "compute_hours": 0.0})
  p.step(3, {"rollout/pass_rate": 0.5})  # not a logging step: silent
  p.step(5, {"rollout/pass_rate": 0.5, "gen/tokens_per_s": 12345.0,
             "train/tokens_per_s": 2000.0, "staleness/mean": 0.75, "staleness/max": 2.0,
             "rollout/truncated_frac": 0.125})
  lines = out.getvalue().splitlines()
  assert len(lines) == 2
  assert lines[0].startswith("step  0/20 | val 0.250")
  assert "val 0.250 | rollouts 0.50 | gen 12.3k tok/s | train 2.0k tok/s | stale 0.8/2 | " \
         "trunc 0.12" in lines[1]
  labels = [part.split()[0] for part in lines[1].split(" | ")]
  assert len(labels) == len(set(labels)), f"a label shows twice: {labels}"
  assert "ETA" in lines[1]


def test_disabled_prints_nothing():
  out = io.StringIO()
  p = progress.Progress(total_steps=2, stream=out, enabled=False)
  p.step(1, {"val/pass_rate": 0.5})
  p.print("x")
  assert out.getvalue() == ""


def test_mixed_domain_runs_show_each_domains_val_rate():
  out = io.StringIO()
  p = progress.Progress(total_steps=20, log_every=5, stream=out)
  p.step(0, {"val/pass_rate": 0.5, "val/math/pass_rate": 0.625, "val/code/pass_rate": 0.375,
             "val/math/num_prompts": 8.0, "compute_hours": 0.0})
  p.step(5, {"rollout/pass_rate": 0.5, "rollout/math/pass_rate": 0.75})
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("step  0/20 | val 0.500 (math 0.62 code 0.38)")
  assert "| val 0.500 (math 0.62 code 0.38) | rollouts 0.50" in lines[1]  # the last eval's


class _Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_eval_progress_prints_after_the_first_wait_then_every_interval():
  out, clock = io.StringIO(), _Clock()
  p = progress.Progress(total_steps=200, stream=out)
  report = progress.eval_progress(p, 100, first_s=10.0, every_s=60.0, clock=clock)
  clock.now += 9.0
  report(100, 16000)  # before first_s: silent
  assert out.getvalue() == ""
  clock.now += 2.0
  report(0, 16000)  # 11 s in, nothing finished yet: no ETA
  clock.now += 169.0
  report(4800, 16000)  # 180 s in: 4,800 done, 11,200 to go at 26.7 samples/s
  clock.now += 30.0
  report(6000, 16000)  # within every_s of the last line: silent
  clock.now += 40.0
  report(16000, 16000)  # the end: the step's own line follows, so silent
  assert out.getvalue().splitlines() == [
      "  eval of step 100: 0/16.0k samples (0%) in 11s",
      "  eval of step 100: 4.8k/16.0k samples (30%) in 3m00s, ETA 7m00s"]


def test_eval_progress_of_a_sharded_eval_says_it_counts_a_share():
  out, clock = io.StringIO(), _Clock()
  report = progress.eval_progress(progress.Progress(200, stream=out), 100, processes=4,
                                  first_s=0.0, clock=clock)
  clock.now += 180.0
  report(1200, 4000)
  assert out.getvalue() == ("  eval of step 100: 1.2k/4.0k samples of this process's 1/4 "
                            "share (30%) in 3m00s, ETA 7m00s\n")


def test_eval_progress_follows_the_progress_switch():
  out, clock = io.StringIO(), _Clock()
  report = progress.eval_progress(progress.Progress(2, stream=out, enabled=False), 1,
                                 first_s=0.0, clock=clock)
  report(1, 4)
  assert out.getvalue() == ""
