"""The RL training loop shared by every mode: step, log, evaluate, forecast, checkpoint.

One iteration (step s, trainer at policy version s - 1):
  1. take P scored groups from the mode's source (the wait is the trainer's idle time);
  2. build the fixed-shape batch (advantages, zero-variance filter) and update the
     No-Positive-Resampling history;
  3. run the jitted step, post the new weights to the source (the generator), fetch metrics;
  4. a non-finite loss or gradient leaves the parameters untouched (the step skips it);
     `optim.max_nonfinite_steps` in a row abort the run without saving;
  5. evaluate every `eval.every` steps and refit the live forecast;
  6. write one metrics row (step, compute_hours, FLOPs, ...) and the progress line;
  7. checkpoint every `checkpoint.every` steps, at the end, and on SIGTERM / SIGINT.

A signal (`preempt.StopRequest`) interrupts the wait for rollouts or an eval in progress at
once (a train step in progress finishes). An interrupted eval is redone after resume: the
checkpoint is written at its step, holding the step's metrics row as `pending_row`, and the
resumed loop evaluates the restored (identical) params with the same seeds before its first
step, then writes that row. The stream never holds a row without its scheduled eval.

compute_hours (`clock.RLClock`) counts the accelerator time of generation and training
only: the loop's wall time less evaluation, checkpointing and compiles, which each row
logs separately (time/eval_s, time/checkpoint_s, time/compile_s, per step).

The metrics stream has exactly one row per step 0..N: row 0 is the evaluation of the
starting policy (R0 of the forecast), row s is step s with its eval merged in.

Several processes (`gather` given): every process runs this loop in lockstep. Its source
yields this process's share of the step's groups; one host-side exchange per step
(`parallel.distributed.allgather`) hands every process all P groups in process order,
together with each process's stop request (a signal) or failure, so that all of them
train the same batch, or all stop at the same step (a stop anywhere saves a checkpoint
everywhere; a failure anywhere raises everywhere) and none is left waiting in a
collective. The policy version is the step count, the same everywhere. Per-process
generator numbers are combined (`combine_metrics`); the checkpoint's host state holds every
process's data position.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl_scale import checkpoint as checkpoint_lib
from jaxrl_scale import metrics as metrics_lib
from jaxrl_scale import preempt
from jaxrl_scale.config import Config
from jaxrl_scale.errors import UserError
from jaxrl_scale.pipeline import clock as clock_lib
from jaxrl_scale.pipeline import generator
from jaxrl_scale.pipeline import progress as progress_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.pipeline import staleness as staleness_lib
from jaxrl_scale.rl import curriculum as curriculum_lib
from jaxrl_scale.rl import train_step

log = logging.getLogger(__name__)


# Steps in a row without a reward signal before the loop says so (`Loop._check_signal`).
NO_SIGNAL_STEPS = 3


class TrainingAborted(UserError):
  """Too many non-finite steps in a row; the checkpoints on disk are untouched."""


@dataclasses.dataclass
class HostState:
  """Everything besides the arrays that a resumed run needs (saved as JSON).

  Attributes:
    step: RL steps done.
    policy_version: version of the weights (one per step; tokens record it).
    metrics_rows: rows of metrics.jsonl that belong to this state (steps 0..step); a
      resumed writer drops the rest.
    compute_hours: accelerator-hours spent in RL so far.
    flops: estimated FLOPs spent in RL so far.
    nonfinite_streak: non-finite steps in a row at the end of the last step.
    source: the rollout source's data position and sequence counter.
    curriculum: No-Positive-Resampling state (None when off).
    sft_compute_hours: accelerator-hours of the SFT warm start.
    seed: run seed (sampler seeds derive from it and the sequence counter).
    pending_row: the metrics row of step `step` when a stop interrupted its eval (the
      resumed run redoes the eval, then writes the row); None otherwise.
  """

  step: int = 0
  policy_version: int = 0
  metrics_rows: int = 1
  compute_hours: float = 0.0
  flops: float = 0.0
  nonfinite_streak: int = 0
  source: dict[str, Any] = dataclasses.field(default_factory=dict)
  curriculum: dict[str, Any] | None = None
  sft_compute_hours: float = 0.0
  seed: int = 0
  pending_row: dict[str, Any] | None = None

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: dict[str, Any], origin: str) -> HostState:
    names = {f.name for f in dataclasses.fields(cls)}
    data = {"pending_row": None, **data}  # checkpoints from before preemption at any moment
    missing = names - set(data)
    if missing:
      raise UserError(f"{origin}: checkpoint host state lacks {sorted(missing)}")
    return cls(**{k: data[k] for k in names})


@dataclasses.dataclass
class Outcome:
  """How the loop ended: 'done', 'signal' (SIGTERM/SIGINT, checkpoint saved)."""

  reason: str
  step: int
  signal_name: str | None = None
  last_eval: dict[str, float] | None = None


def combine_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
  """One row from the per-process rows of a multi-process run's source metrics.

  Throughputs and counts add up (`*tokens_per_s`, `queue/*`, `*count`, `*dropped_stale`),
  maxima stay maxima (`*max`), everything else (idle fractions, busy seconds) is averaged.
  """
  out: dict[str, float] = {}
  for key in dict.fromkeys(k for row in rows for k in row):
    values = [float(row[key]) for row in rows if row.get(key) is not None]
    if not values:
      continue
    if (key.endswith("tokens_per_s") or key.startswith("queue/") or key.endswith("count")
        or key.endswith("dropped_stale")):
      out[key] = sum(values)
    elif key.endswith("max"):
      out[key] = max(values)
    else:
      out[key] = sum(values) / len(values)
  return out


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
  """A metrics row as plain JSON values (host state is saved as JSON)."""
  return {k: v if isinstance(v, (list, str)) or v is None else float(v)
          for k, v in row.items()}


class ProcessFailed(RuntimeError):
  """Another process of a multi-process run failed; this one stops with it."""


class Loop:
  """Runs RL steps `state.step + 1 .. cfg.run.steps` (see the module docstring).

  Args:
    cfg: the run config.
    trainer: the RL Trainer on the trainer slice.
    source: the mode's rollout source.
    evaluator: an `eval.Evaluator`, or None for no validation.
    writer: the metrics stream.
    checkpointer: where checkpoints go (None: never save).
    forecaster: a `scaling.live.LiveForecaster`, or None.
    curriculum: No-Positive-Resampling, or None.
    shape: the fixed batch shape.
    state: host state to continue from.
    clock: compute clock (its hours continue `state.compute_hours`); the loop starts it.
    flops_per_token: forward FLOPs per token (2 x parameters).
    progress: the console display.
    gather: multi-process runs: `parallel.distributed.allgather` (None: one process).
    stop: the run's stop request (default: a new one, installed while `run` runs).
  """

  def __init__(self, cfg: Config, *, trainer: train_step.Trainer, source: Any,
               evaluator: Any, writer: metrics_lib.MetricsWriter,
               checkpointer: checkpoint_lib.Checkpointer | None, forecaster: Any,
               curriculum: curriculum_lib.NoPositiveResampling | None,
               shape: rollouts.BatchShape, state: HostState, clock: clock_lib.RLClock,
               flops_per_token: float, progress: progress_lib.Progress,
               gather: Callable[..., list[Any]] | None = None,
               stop: preempt.StopRequest | None = None):
    self.cfg = cfg
    self.gather = gather
    self.trainer = trainer
    self.source = source
    self.evaluator = evaluator
    self.writer = writer
    self.checkpointer = checkpointer
    self.forecaster = forecaster
    self.curriculum = curriculum
    self.curriculum_lock = threading.Lock()
    self.shape = shape
    self.state = state
    self.clock = clock
    self.flops_per_token = flops_per_token
    self.progress = progress
    self._forecast_line: str | None = None
    self.last_eval: dict[str, float] | None = None
    self._signal: int | None = None
    self.stop = stop if stop is not None else preempt.StopRequest(
        cfg.checkpoint.preempt_grace_seconds)
    self.stop.subscribe(self._on_stop)
    self._t_start = time.perf_counter()
    self._excluded: dict[str, float] = {}
    self._t_row = self._t_start
    self._train_s = 0.0
    self._wait_s = 0.0
    self._part_sizes: list[int] = []
    self._no_signal = 0  # steps in a row that trained nothing (every group's rewards equal)
    self.on_step: Callable[[int, dict[str, Any]], None] | None = None  # tests, benchmarks

  # ---- signals -----------------------------------------------------------------------------

  def _on_stop(self, signum: int) -> None:
    """The stop request's callback (maybe in its watcher thread: flags and a print only)."""
    self._signal = signum
    interrupt = getattr(self.source, "interrupt", None)
    if interrupt is not None:
      interrupt()
    self.progress.print(f"received {signal.Signals(signum).name}: saving a checkpoint, then "
                        "exiting")

  def _interrupted_elsewhere(self) -> None:
    """A sharded eval stops everywhere when any process was signalled (`eval.Evaluator`)."""
    if self._signal is None:
      self._signal = signal.SIGTERM
      self.progress.print("another process received a signal: saving a checkpoint, then "
                          "exiting")

  def request_stop(self, signum: int = signal.SIGTERM) -> None:
    """What a signal does, callable from anywhere (tests)."""
    self.stop.request(signum)

  # ---- pieces ------------------------------------------------------------------------------

  def keep_prompt(self, prompt_id: str) -> bool:
    """The PromptSource keep hook (called from the generator thread in pipelined mode)."""
    if self.curriculum is None:
      return True
    with self.curriculum_lock:
      return self.curriculum.should_keep(prompt_id)

  def evaluate(self, step: int) -> dict[str, float]:
    """Validation at `step` plus the refit forecast, as metrics."""
    if self.evaluator is None:
      return {}
    with self.clock.excluded("eval"):
      return self._evaluate(step)

  def _evaluate(self, step: int) -> dict[str, float]:
    out = self.evaluator.run(self.trainer.params, step, progress_lib.eval_progress(
        self.progress, step, processes=jax.process_count()))
    self.last_eval = out
    self.state.flops += self.flops_per_token * self._eval_tokens(out)
    # An eval without a single verdict (every verifier call failed) has no pass rate (NaN):
    # no point for the forecast.
    if self.forecaster is not None and math.isfinite(out.get("val/pass_rate", math.nan)):
      # The forecaster's axis (model FLOPs by default: hours move with machine load); the
      # row's "flops" is this value (eval included), so `fit --x flops` reads the same.
      hours = self.clock.hours
      x = self.state.flops if self.forecaster.axis == "flops" else hours
      fit = self.forecaster.update(x, out["val/pass_rate"], step=step, hours=hours,
                                   eval_size=out.get("val/num_prompts", float("nan"))
                                   * out.get("val/samples_per_prompt", float("nan")))
      if fit is not None and fit.step == step:
        out.update(fit.as_metrics())
        self._forecast_line = "  " + fit.summary()  # printed under the step's line
      # A mixed-domain eval: each domain's own forecast, forecast/<domain>/A etc.
      domain_metrics, lines = self.forecaster.update_domains(x, out, step=step, hours=hours)
      out.update(domain_metrics)
      if lines:
        self._forecast_line = "\n".join([self._forecast_line or "  forecast (per domain):"]
                                        + lines)
    return out

  def _print_forecast(self) -> None:
    if self._forecast_line is not None:
      self.progress.print(self._forecast_line)
      self._forecast_line = None

  def _eval_tokens(self, out: dict[str, float]) -> float:
    n = out.get("val/num_prompts", 0.0) * self.evaluator.k
    return n * (out.get("val/length_mean", 0.0) + self.shape.seq_len / 2)

  def save(self, step: int) -> None:
    if self.checkpointer is None or self.checkpointer.latest_step() == step:
      return
    source = self.source.state()
    if self.gather is not None:  # every process's own data position, in process order
      source = {"processes": self.gather(source, name="source_state")}
    self.state.source = source
    self.state.policy_version = step
    # Rows 0..step are final; with the step's eval pending, rows 0..step - 1.
    self.state.metrics_rows = step + (self.state.pending_row is None)
    if self.curriculum is not None:
      with self.curriculum_lock:
        self.state.curriculum = self.curriculum.state_dict()
    with self.clock.excluded("checkpoint"):
      self.checkpointer.save(step, self.trainer.state, self.state.to_json())

  def initial_eval(self) -> None:
    """Row 0: the starting policy's pass rate (the forecast's R0), at compute 0.

    The RL compute clock starts after it: measuring the starting point is not training.
    A stop during it leaves row 0 pending (`save(0)` then records that; `run` stops).
    """
    row: dict[str, Any] = {}
    if self.evaluator is not None:
      try:
        row.update(self.evaluate(0))
      except preempt.Interrupted:
        self._interrupted_elsewhere()
        self.state.pending_row = {}
        self.progress.print("  the eval of step 0 was interrupted: it is redone on resume")
        return
    self.state.pending_row = None
    self.state.flops = 0.0
    row.update(compute_hours=0.0, flops=0.0)
    self.state.compute_hours = 0.0
    self.clock = clock_lib.RLClock(self.clock.num_devices, start_hours=0.0)
    self.writer.write(0, row)
    self.progress.step(0, row)
    self._print_forecast()

  # ---- the loop ----------------------------------------------------------------------------

  def run(self) -> Outcome:
    try:
      with self.stop.installed():
        return self._run()
    finally:
      self.clock.stop()

  def _stopped(self, step: int) -> Outcome | None:
    if self._signal is None:
      return None
    self.save(step)
    name = signal.Signals(self._signal).name
    return Outcome("signal", step, name, self.last_eval)

  def _run(self) -> Outcome:
    cfg = self.cfg
    total = cfg.run.steps
    step = self.state.step
    # A stop interrupted this step's eval before the checkpoint: redo it first (step 0's
    # before the clock starts, as in a fresh run).
    redo = self.state.pending_row is not None and self._signal is None
    if redo and step == 0:
      self.initial_eval()
    self.progress.restart(step)
    self._t_start = time.perf_counter()
    self.clock.start()
    self._excluded = dict(self.clock.excluded_s)
    self._t_row = time.perf_counter()
    if redo and step > 0:
      row, self.state.pending_row = self.state.pending_row, None
      if self._finish_step(step, row):
        return self._stopped(step)
    while step < total:
      t0 = time.perf_counter()
      got = self._next_groups(step)
      if got is None:
        return self._stopped(step)
      local, groups = got
      t1 = time.perf_counter()
      row = self._train_step(step, groups, local)
      t2 = time.perf_counter()
      step += 1
      self.state.step = step
      row["time/wait_s"], row["time/train_s"] = t1 - t0, t2 - t1
      # Which groups this step trained on (admission numbers): an audit trail that shows
      # every group trained once, across resumes too.
      row["rollout/group_ids"] = self._group_ids(groups)
      self._wait_s += t1 - t0
      self._train_s += t2 - t1
      elapsed = time.perf_counter() - self._t_start
      row["time/trainer_idle_frac"] = self._wait_s / elapsed if elapsed > 0 else 0.0
      source_metrics = self.source.metrics(step)
      if self.gather is not None:
        source_metrics = combine_metrics(self.gather(source_metrics, name="source_metrics"))
      row.update(source_metrics)
      if self._finish_step(step, row):
        return self._stopped(step)
    return self._stopped(step) or Outcome("done", step, None, self.last_eval)

  def _finish_step(self, step: int, row: dict[str, Any]) -> bool:
    """Eval (when due), then writes the row and checkpoints (when due) for `step`.

    Returns True when a stop interrupted the eval: the row is kept as `pending_row` (for
    the checkpoint) and not written.
    """
    cfg = self.cfg
    if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.run.steps):
      try:
        row.update(self.evaluate(step))
      except preempt.Interrupted:
        self._interrupted_elsewhere()
        self.state.pending_row = _jsonable(row)
        self.state.compute_hours = self.clock.hours
        self.progress.print(f"  the eval of step {step} was interrupted: it is redone on "
                            "resume")
        return True
    row["compute_hours"] = self.clock.hours
    for kind, total_s in self.clock.excluded_s.items():
      row[f"time/{kind}_s"] = total_s - self._excluded.get(kind, 0.0)
    self._excluded = dict(self.clock.excluded_s)
    now = time.perf_counter()
    row["time/step_s"], self._t_row = now - self._t_row, now  # since the previous row
    row["flops"] = self.state.flops
    self.state.compute_hours = row["compute_hours"]
    self.writer.write(step, row)
    self.progress.step(step, row)
    self._print_forecast()
    if self.on_step is not None:
      self.on_step(step, row)
    self._check_nonfinite(step, row)
    self._check_signal(step, row)
    if step == cfg.run.steps or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0):
      self.save(step)
    return False

  def _next_groups(self, step: int
                   ) -> tuple[list[rollouts.Group], list[rollouts.Group]] | None:
    """(this process's groups, the step's groups), or None when the run must stop here.

    One process: the source's groups are the step's. Several: each process's share is
    exchanged (with stop requests and failures, see the module docstring).
    """
    local: list[rollouts.Group] | None = None
    error: BaseException | None = None
    if self._signal is None:
      try:
        local = self.source.next_groups(step)
      except generator.Interrupted:
        pass
      except Exception as e:  # noqa: BLE001 - re-raised below, after telling the others
        if self.gather is None:
          raise
        error = e
    if self.gather is None:
      return None if local is None else (local, local)
    payload = {"signal": self._signal, "error": None if error is None else
               f"{type(error).__name__}: {error}", "groups": local}
    parts = self.gather(payload, name="groups")
    if error is not None:
      raise error
    failed = [(p, part["error"]) for p, part in enumerate(parts) if part["error"]]
    if failed:
      p, message = failed[0]
      raise ProcessFailed(f"process {p} failed at step {step + 1}: {message}")
    signals = [part["signal"] for part in parts if part["signal"] is not None]
    if signals or local is None:
      if self._signal is None:
        self._signal = signals[0] if signals else signal.SIGTERM
        self.progress.print(f"another process received {signal.Signals(self._signal).name}: "
                            "saving a checkpoint, then exiting")
      return None
    self._part_sizes = [len(part["groups"]) for part in parts]
    return local, [g for part in parts for g in part["groups"]]

  def _group_ids(self, groups: list[rollouts.Group]) -> list[int]:
    """The step's groups' admission numbers; with several processes (each numbers its own
    groups) seq * processes + process, unique across the job."""
    if self.gather is None:
      return [g.seq for g in groups]
    owners = [p for p, n in enumerate(self._part_sizes) for _ in range(n)]
    return [g.seq * len(self._part_sizes) + p for g, p in zip(groups, owners)]

  def _train_step(self, step: int, groups: list[rollouts.Group],
                  local: list[rollouts.Group] | None = None) -> dict[str, Any]:
    """Batch, update and host-side bookkeeping for one step; returns its metrics row.

    `groups` are the step's groups (all processes'); `local` this process's own (default:
    all of them), the ones its source hands back as consumed.
    """
    local = groups if local is None else local
    version = step  # policy version the trainer holds before this update
    batch, row, keep = rollouts.build_batch(
        groups, self.cfg.rl, self.shape, domains=[s.domain for s in self.cfg.data.sources])
    row.update(staleness_lib.summarize(
        staleness_lib.token_staleness([c.versions for g in groups for c in g.completions],
                                      version),
        self.cfg.pipeline.max_staleness))
    if self.curriculum is not None:
      with self.curriculum_lock:
        retired = self.curriculum.update([g.prompt.id for g in groups],
                                         np.stack([g.rewards_G for g in groups]))
        row.update({f"curriculum/{k}": v for k, v in self.curriculum.stats().items()})
      row["curriculum/retired_now"] = float(len(retired))
    gen_tokens = sum(len(g.prompt.token_ids) + c.num_tokens
                     for g in groups for c in g.completions)
    t0 = time.perf_counter()
    if keep.any():
      metrics = self.trainer.step(batch)
      self.source.after_step(local, self.trainer.params, version + 1)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      train_tokens = metrics.get("tokens", 0.0)
    else:
      # Every prompt had equal rewards: no signal, so no update (Adam's momentum alone would
      # still move the weights).
      self.source.after_step(local, self.trainer.params, version + 1)
      metrics, train_tokens = {"skipped_no_signal": 1.0}, 0.0
    train_s = time.perf_counter() - t0
    row.update({f"train/{k}": v for k, v in metrics.items()})
    row["train/tokens_per_s"] = train_tokens / train_s if train_s > 0 else 0.0
    # FLOPs: forward over sampled sequences, forward + backward (3x) over trained ones.
    self.state.flops += self.flops_per_token * (gen_tokens + 3 * train_tokens)
    return row

  def _check_signal(self, step: int, row: dict[str, Any]) -> None:
    """Says so, once a streak reaches NO_SIGNAL_STEPS, when steps train nothing because
    every prompt's rewards were equal (a random policy that never scores looks like this)."""
    if not row.get("train/skipped_no_signal"):
      self._no_signal = 0
      return
    self._no_signal += 1
    if self._no_signal != NO_SIGNAL_STEPS:
      return
    wrong = int(row.get("rollout/num_all_wrong", 0))
    right = int(row.get("rollout/num_all_correct", 0))
    fix = ("a policy that never scores needs a warm start (sft.steps) or easier prompts"
           if wrong >= right else "a policy that always scores needs harder prompts")
    self.progress.print(
        f"  note: steps {step - NO_SIGNAL_STEPS + 1}-{step} trained nothing: every prompt's "
        f"{self.cfg.rl.generations_per_prompt} rewards were equal (step {step}: {wrong} "
        f"prompts all wrong, {right} all right), so no sample had an advantage; {fix}")

  def _check_nonfinite(self, step: int, row: dict[str, Any]) -> None:
    if not row.get("train/nonfinite"):
      self.state.nonfinite_streak = 0
      return
    self.state.nonfinite_streak += 1
    limit = self.cfg.optim.max_nonfinite_steps
    log.warning("step %d: non-finite loss or gradient, update skipped (%d in a row)", step,
                self.state.nonfinite_streak)
    if self.state.nonfinite_streak >= limit:
      latest = self.checkpointer.latest_step() if self.checkpointer is not None else None
      where = (f"the last checkpoint (step {latest}) is intact; " if latest is not None
               else "")
      raise TrainingAborted(
          f"training aborted at step {step}: the loss or gradients were NaN/inf for "
          f"{self.state.nonfinite_streak} steps in a row (optim.max_nonfinite_steps={limit}); "
          f"{where}lower optim.lr or set optim.max_grad_norm, then resume")
