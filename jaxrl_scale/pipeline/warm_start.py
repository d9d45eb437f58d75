"""The SFT warm start before RL, optionally stopped at a target pass rate.

The paper starts RL from a model that already solves some prompts (notes sec. 8); on CPU a
random-init policy would see no reward for a long time. A small model learns a task like
2-digit addition in a sudden jump whose timing varies from seed to seed (and from machine
to machine, since float rounding differs), so a fixed number of SFT steps can leave RL
anywhere between 0.02 and 0.9. With `run.sft_stop_pass_rate` the warm start instead samples
a few training prompts held out of SFT (never the validation prompts) every
`run.sft_check_every` steps, exactly as the eval does, and stops once their pass rate
reaches the target. Once a check has passed half the target the jump is under way, so it
checks every `run.sft_check_every_near` steps (default every step) from then on: the warm
start stops close to the target instead of overshooting it by a whole interval.

A stop request (SIGTERM, `jaxrl_scale.preempt`) ends the warm start after the SFT step in
flight, or abandons a dev check mid-way; its state (params, optimizer, steps done, the last
dev pass rate, a step whose check was interrupted, the hours) goes to `state_dir` and
`run` raises Interrupted. The next run of the same command continues from there: the SFT
batches depend only on the step and the checks use fixed seeds, so it ends exactly where an
uninterrupted warm start would have (sft.jsonl gets the remaining rows). `discard` removes
the state once RL's first checkpoint holds the result.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import time
from typing import Any

import jax
from flax import nnx

from jaxrl_scale import checkpoint as checkpoint_lib
from jaxrl_scale import eval as eval_lib
from jaxrl_scale import metrics as metrics_lib
from jaxrl_scale import preempt
from jaxrl_scale.config import Config
from jaxrl_scale.data import mixture
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine
from jaxrl_scale.pipeline import environment
from jaxrl_scale.pipeline import progress as progress_lib
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import sft as sft_lib

log = logging.getLogger(__name__)

_DEV_SALT = 0xD5  # dev samples use other seeds than the validation eval


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)


def has_state(state_dir: pathlib.Path | None) -> bool:
  """Whether an interrupted warm start left its state in `state_dir`."""
  return state_dir is not None and state_dir.is_dir() and any(
      p.name.isdigit() for p in state_dir.iterdir())


def discard(state_dir: pathlib.Path | None) -> None:
  """Removes a warm start's saved state (RL's checkpoint 0 supersedes it)."""
  if state_dir is not None and state_dir.exists():
    shutil.rmtree(state_dir, ignore_errors=True)


def run(cfg: Config, tok: Any, model: nnx.Module, mesh, seq_len: int, run_dir: pathlib.Path,
        progress: progress_lib.Progress, *, sampler: engine.Sampler | None = None,
        scorer: Any = None, pool: Any = None, shard: tuple[int, int] = (0, 1),
        gather: Any = None, stop: preempt.StopRequest | None = None,
        state_dir: pathlib.Path | None = None, agree: Any = None, sleep: bool = False,
        episode_for: Any = None) -> tuple[nnx.Module, float, dict[str, float]]:
  """SFT on the training prompts' solutions.

  Args:
    cfg: the run config (sft.*, run.sft_stop_pass_rate / sft_dev_prompts / sft_check_every).
    tok: the tokenizer.
    model: the policy on `mesh`; its buffers pass to the SFT trainer.
    mesh: the trainer mesh.
    seq_len: fixed sequence length (longer examples are dropped).
    run_dir: where sft.jsonl goes.
    progress: the console.
    sampler, scorer, pool: sample and score the dev prompts (needed with a stop target).
    shard, gather: several processes: each samples its share of the dev prompts and the
      counts are combined (see `eval.Evaluator`), so all of them stop at the same step.
    stop: the run's stop request (None: never stops early); a dev check in progress stops
      at the next decode chunk.
    state_dir: where the state of an interrupted warm start is saved and resumed from (one
      directory all processes share).
    agree: several processes: `agree(flag)` is whether any process's flag is set (an
      exchange per step, so all of them stop after the same step).
    sleep: colocated roles: the sampler frees its device memory before the first SFT step
      and after each dev check (`engine.Sampler.sleep`; a check posts the weights it needs).
    episode_for: the run's environment (pipeline/environment.py): dev checks run episodes,
      and the solutions are played through it as multi-turn traces (`trace_examples`).

  Returns:
    (policy, accelerator-hours of the trainer slice, {"steps", "dev_pass_rate"}).

  Raises:
    preempt.Interrupted: `stop` was requested; the state is in `state_dir`.
  """
  target = cfg.run.sft_stop_pass_rate
  n_dev = cfg.run.sft_dev_prompts if target is not None else 0
  # Its own stream (RL's is untouched), mixed by the sources' sft_weight.
  prompts = mixture.from_config(cfg.data, tok, sft=True)
  if n_dev >= prompts.num_train:
    raise UserError(f"config key 'run.sft_dev_prompts': {n_dev} leaves no SFT examples of "
                    f"{prompts.num_train} training prompts")
  drawn = prompts.take(min(prompts.num_train, cfg.sft.steps * cfg.sft.batch_size + n_dev))
  dev, train = drawn[:n_dev], drawn[n_dev:]
  if episode_for is not None:
    # Multi-turn: the solutions' turns played through the environment, one example per
    # model turn (the environment's tokens are context, not targets).
    examples, dropped = environment.trace_examples(
        train, tok, episode_for, cfg.sampler.stop_strings, workers=cfg.env.workers)
    if dropped:
      log.warning("SFT dropped %d solutions whose episode ended before their last turn",
                  dropped)
  else:
    examples = [(p.token_ids, tok.encode(p.solution) + [tok.eos_id])
                for p in train if p.solution]
  fitting = [(p, s) for p, s in examples if len(p) + len(s) <= seq_len]
  if not fitting:
    raise UserError("config key 'sft.steps': > 0 but no training prompt has a solution that "
                    f"fits {seq_len} tokens (set data.solution_field, or sft.steps=0)")
  if len(fitting) < len(examples):
    log.warning("SFT dropped %d examples longer than %d tokens", len(examples) - len(fitting),
                seq_len)
  checker = None
  if target is not None:
    if sampler is None or scorer is None:
      raise ValueError("a stop target needs a sampler and a scorer")
    sampler = preempt.Interruptible(sampler, stop) if stop is not None else sampler
    checker = eval_lib.Evaluator(sampler, dev, scorer,
                                 samples_per_prompt=cfg.eval.samples_per_prompt,
                                 temperature=cfg.eval.temperature,
                                 seed=cfg.run.seed ^ _DEV_SALT, pool=pool, shard=shard,
                                 gather=gather, stop=stop, episode_for=episode_for)

  trainer = sft_lib.make_trainer(model, mesh, cfg.sft, cfg.optim)
  if sleep and sampler is not None:
    sampler.sleep()  # the SFT steps have the chips; a dev check posts the weights it needs
  steps, size = cfg.sft.steps, cfg.sft.batch_size
  every = max(1, steps // 5)
  info = {"steps": 0.0, "dev_pass_rate": float("nan")}
  done, hours, pending = 0, 0.0, None
  if has_state(state_dir):
    with checkpoint_lib.Checkpointer(state_dir, keep=1, async_save=False) as ckpt:
      saved_at, trainer.state, saved = ckpt.restore(_abstract(trainer.state))
    done, hours, pending = saved["steps"], saved["hours"], saved["pending_metrics"]
    info.update(steps=float(done), dev_pass_rate=saved["dev_pass_rate"])
    progress.print(f"  resuming the interrupted SFT warm start after step {saved_at}")
  clock = metrics_lib.ComputeClock(mesh.devices.size, start_hours=hours)
  t0 = time.perf_counter()
  stop_text = (f", stopping once {len(dev)} held-out training prompts pass at {target:g}"
               if target is not None else "")
  progress.print(f"SFT warm start: up to {steps} steps on {len(fitting)} examples{stop_text}")

  def save_and_stop(metrics: dict[str, float] | None):
    """Saves the state after `info["steps"]` steps (`metrics`: that step's, its check
    interrupted) and raises Interrupted."""
    if state_dir is not None and (info["steps"] > 0):
      with checkpoint_lib.Checkpointer(state_dir, keep=1, async_save=False) as ckpt:
        ckpt.save(int(info["steps"]), trainer.state, {
            "steps": int(info["steps"]), "hours": clock.hours, "pending_metrics": metrics,
            "dev_pass_rate": info["dev_pass_rate"]})
      progress.print(f"  SFT warm start stopped after step {int(info['steps'])}: its state is "
                     f"in {state_dir}; the same command continues it")
    raise preempt.Interrupted()

  rows = []
  if done and (run_dir / "sft.jsonl").exists():  # the rows of the steps done, no others
    rows = (run_dir / "sft.jsonl").read_text().splitlines()[:done - (pending is not None)]
  with open(run_dir / "sft.jsonl", "w", encoding="utf-8") as f:
    f.writelines(row + "\n" for row in rows)

    def record(step: int, m: dict[str, float], dev_rate: float | None = None,
               dev_domains: dict[str, float] | None = None) -> None:
      row = {"step": step, **m}
      if dev_rate is not None:
        row["dev/pass_rate"] = dev_rate
        row.update(dev_domains or {})
      f.write(json.dumps(row) + "\n")
      f.flush()
      if (step + 1) % every == 0 or step + 1 == steps or dev_rate is not None and (
          dev_rate >= target):
        dev_text = f" | dev pass {dev_rate:.3f}" if dev_rate is not None else ""
        progress.print(f"  sft {step + 1}/{steps} | loss {m['loss']:.3f} | token acc "
                       f"{m['token_accuracy']:.3f}{dev_text} | {time.perf_counter() - t0:.0f}s")

    def stopping() -> bool:
      flag = stop is not None and stop.is_set()
      return agree(flag) if agree is not None else flag

    step = done
    while True:
      if pending is None:  # train the next step
        if step >= steps:
          break
        if stopping():
          save_and_stop(None)
        chunk = [fitting[(step * size + j) % len(fitting)] for j in range(size)]
        batch = batch_lib.pack_sft([p for p, _ in chunk], [s for _, s in chunk],
                                   seq_len=seq_len, pad_id=tok.pad_id)
        m = {k: float(v) for k, v in jax.device_get(trainer.step(batch)).items()}
        step += 1
        info["steps"] = float(step)
      else:  # the saved step whose dev check was interrupted: check it now
        m, pending = pending, None
      dev_rate, dev_domains = None, None
      near = info["dev_pass_rate"] >= target / 2 if target is not None else False
      every = cfg.run.sft_check_every_near if near else cfg.run.sft_check_every
      if checker is not None and step % every == 0:
        try:
          out = checker.run(trainer.params, 0)
        except preempt.Interrupted:
          save_and_stop(m)
        if sleep:
          sampler.sleep()
        dev_rate = out["val/pass_rate"]
        # A mixed-domain run's dev set: each domain's rate too (dev/<domain>/pass_rate).
        dev_domains = {"dev/" + k[len("val/"):]: v for k, v in out.items()
                       if k.count("/") == 2 and k.endswith("/pass_rate")}
        info["dev_pass_rate"] = dev_rate
      record(step - 1, m, dev_rate, dev_domains)
      if dev_rate is not None and dev_rate >= target:
        break
  return trainer.model(), clock.hours, info
