"""The console view of a run: one line per logged step, forecast lines, the final summary.

    step  12/40 | val 0.62 | rollouts 0.55 | gen 1.2k tok/s | train 3.4k tok/s | stale 0.8/2 |
      trunc 0.02 | 3.1 s/step | ETA 1m10s

val: validation pass rate (last eval; a mixed-domain run adds each domain's, "val 0.62
(math 0.70 code 0.54)"); rollouts: pass rate of the step's training samples;
gen / train: generated and trained tokens per second; stale: mean / max token staleness.
    forecast: plateau A=0.871 [0.840, 0.900], steepness B=1.90, half-gain at C_mid=2.10e+14
      FLOPs (~0.021 h); pass rate at 6.10e+14 FLOPs (~0.061 h): 0.852 [0.830, 0.870]; 95%
      intervals

A long eval (the paper's 1,000 prompts x 16 samples) prints where it is while it runs,
first after 10 s, then every minute (`eval_progress`); so do the downstream benchmarks
(`eval.downstream`) that follow it on their steps:
      eval of step 100: 4.8k/16.0k samples (30%) in 3m00s, ETA 7m00s
      downstream eval of step 100: 1.2k/4.8k samples (25%) in 2m00s, ETA 6m00s
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from jaxrl_scale.generation import records


def _si(x: float) -> str:
  for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.1f}{unit}"
  return f"{x:.0f}"


def duration(seconds: float) -> str:
  """'1h02m', '3m05s', '42s'."""
  seconds = max(0.0, seconds)
  if seconds >= 3600:
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
  if seconds >= 60:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
  return f"{seconds:.0f}s"


class Progress:
  """Prints progress lines to `stream` (stdout by default)."""

  def __init__(self, total_steps: int, start_step: int = 0, log_every: int = 1,
               stream: TextIO | None = None, enabled: bool = True):
    self.total = total_steps
    self.start_step = start_step
    self.log_every = log_every
    self.stream = stream if stream is not None else sys.stdout
    self.enabled = enabled
    self._t0 = time.perf_counter()
    self.last_val: float | None = None
    self.last_val_domains: dict[str, float] = {}

  def restart(self, start_step: int) -> None:
    """Starts the clock of the s/step and ETA figures (after compile-heavy setup)."""
    self.start_step = start_step
    self._t0 = time.perf_counter()

  def print(self, text: str) -> None:
    if self.enabled:
      print(text, file=self.stream, flush=True)

  def step(self, step: int, row: dict[str, Any]) -> None:
    """One line for `step` (every log_every steps, and always on eval steps)."""
    if "val/pass_rate" in row:
      self.last_val = row["val/pass_rate"]
      self.last_val_domains = {
          k.split("/")[1]: v for k, v in row.items()
          if k.startswith("val/") and k.endswith("/pass_rate") and k.count("/") == 2}
    if not (step % self.log_every == 0 or "val/pass_rate" in row or step == self.total):
      return
    done = step - self.start_step
    elapsed = time.perf_counter() - self._t0
    per_step = elapsed / done if done > 0 else 0.0
    parts = [f"step {step:>{len(str(self.total))}}/{self.total}"]
    if self.last_val is not None:
      by_domain = " ".join(f"{d} {v:.2f}" for d, v in self.last_val_domains.items()
                           if v is not None)
      parts.append(f"val {self.last_val:.3f}" + (f" ({by_domain})" if by_domain else ""))
    get = row.get
    if get("rollout/pass_rate") is not None:
      parts.append(f"rollouts {row['rollout/pass_rate']:.2f}")
    if get("gen/tokens_per_s") is not None:
      parts.append(f"gen {_si(row['gen/tokens_per_s'])} tok/s")
    if get("train/tokens_per_s") is not None:
      parts.append(f"train {_si(row['train/tokens_per_s'])} tok/s")
    if get("staleness/mean") is not None:
      parts.append(f"stale {row['staleness/mean']:.1f}/{row['staleness/max']:.0f}")
    if get("rollout/truncated_frac") is not None:
      parts.append(f"trunc {row['rollout/truncated_frac']:.2f}")
    if get("train/nonfinite"):
      parts.append("NON-FINITE (skipped)")
    if done > 0:
      parts.append(f"{per_step:.2f} s/step")
      parts.append(f"ETA {duration(per_step * (self.total - step))}")
    self.print(" | ".join(parts))


def eval_progress(progress: Progress, step: int, *, what: str = "eval", processes: int = 1,
                  first_s: float = 10.0, every_s: float = 60.0, clock: Any = None) -> Any:
  """`on_progress(done, total)` for an eval: a line after `first_s`, then every `every_s`.

  Short evals print nothing (the step's line follows them). The ETA assumes the remaining
  samples take as long each as the finished ones (early on, with long samples still
  decoding, it is low). `what` names the eval ("downstream eval" for the benchmarks of
  `eval.downstream`). An eval sharded over `processes` counts this process's share, and
  says so.
  """
  share = f" of this process's 1/{processes} share" if processes > 1 else ""

  def line(done: int, total: int, elapsed: float) -> None:
    text = (f"  {what} of step {step}: {_si(done)}/{_si(total)} samples{share} "
            f"({100 * done / max(total, 1):.0f}%) in {duration(elapsed)}")
    if done > 0:
      text += f", ETA {duration(elapsed * (total - done) / done)}"
    progress.print(text)

  return records.throttled(line, first_s=first_s, every_s=every_s, clock=clock)
