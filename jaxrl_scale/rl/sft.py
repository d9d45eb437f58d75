"""SFT warm start: cross-entropy on (prompt, solution) pairs with the RL trainer's machinery.

The paper starts RL from a model that already solves some prompts (notes section 8: a
small SFT before RL). On CPU the demo's random-init policy would otherwise see no reward
for a long time, so a few hundred SFT steps on the built-in tasks' reference solutions give
it a non-trivial starting pass rate. The loss is the token-average negative log-likelihood
of the solution tokens only (prompt tokens and padding carry no loss), computed from the
same float32 log-probs, on the same mesh, with the same compiled-once `Trainer`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jaxrl_scale.config import OptimConfig, SFTConfig
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import placement
from jaxrl_scale.rl import train_step

log = logging.getLogger(__name__)

Example = tuple[Sequence[int], Sequence[int]]  # (prompt token ids, solution token ids)


class SFTObjective:
  """Mean negative log-likelihood over all solution tokens of the full batch."""

  example_dims = 1
  temperature = 1.0  # the model's own distribution

  def model_inputs(self, batch: batch_lib.SFTBatch):
    return batch.tokens_BS, batch.positions_BS, batch.input_mask_BS

  def totals(self, batch: batch_lib.SFTBatch) -> jax.Array:
    return jnp.sum(batch.loss_mask_BS)

  def micro_loss(self, logp_BS, top1_BS, micro: batch_lib.SFTBatch, totals) -> jax.Array:
    del top1_BS
    # where(), not a product: a padding position may hold any finite garbage log-prob.
    nll = -jnp.sum(jnp.where(micro.loss_mask_BS > 0, logp_BS, 0.0))
    return nll / jnp.maximum(totals, 1.0)

  def metrics(self, logp_BS, top1_BS, batch: batch_lib.SFTBatch, totals) -> dict[str, jax.Array]:
    valid_BS = batch.loss_mask_BS > 0
    n = jnp.maximum(totals, 1.0)
    return {
        "num_loss_tokens": totals,
        "token_accuracy": jnp.sum(valid_BS & top1_BS) / n,
        # A sequence is solved when every solution token is the argmax: greedy decoding
        # would reproduce it exactly.
        "sequence_accuracy": _sequence_accuracy(valid_BS, top1_BS),
    }


def _sequence_accuracy(valid_BS: jax.Array, top1_BS: jax.Array) -> jax.Array:
  has_B = jnp.any(valid_BS, axis=-1)
  solved_B = jnp.all(top1_BS | ~valid_BS, axis=-1) & has_B
  return jnp.sum(solved_B) / jnp.maximum(jnp.sum(has_B), 1)


def optim_config(optim: OptimConfig, sft: SFTConfig) -> OptimConfig:
  """The RL optimizer's shape (AdamW, eps, betas) with the SFT section's rate and schedule
  (warmup then constant: the RL section's decay is not the warm start's)."""
  return dataclasses.replace(optim, lr=sft.lr, warmup_steps=sft.warmup_steps,
                             schedule="constant",
                             weight_decay=sft.weight_decay, max_grad_norm=sft.max_grad_norm)


def micro_batches(sft: SFTConfig, mesh: Mesh) -> int:
  """M from `sft.micro_batch_size` (0 = the whole batch), fewer where a micro-batch's
  sequences would not split over the trainer's data-parallel chips
  (`placement.shardable_micro_batches`)."""
  asked = sft.batch_size // sft.micro_batch_size if sft.micro_batch_size else 1
  used = placement.shardable_micro_batches(sft.batch_size, 1, asked, mesh)
  note = placement.micro_batch_note("sft.micro_batch_size", sft.batch_size, 1, asked, used,
                                     mesh)
  if note:
    log.warning(note)
  return used


def make_trainer(model: nnx.Module, mesh: Mesh, sft: SFTConfig, optim: OptimConfig,
                 compiler_options: dict[str, Any] | None = None) -> train_step.Trainer:
  """A Trainer that minimises the SFT loss; `sft.micro_batch_size` sets the accumulation."""
  micro = micro_batches(sft, mesh)
  return train_step.Trainer(model, mesh, optim_config(optim, sft), SFTObjective(),
                            micro_batches=micro, compiler_options=compiler_options)


@dataclasses.dataclass
class SFTResult:
  """What `run_sft` did.

  Attributes:
    trainer: holds the trained parameters (`trainer.model()`, `trainer.params`).
    history: one dict of floats per step.
    skipped_too_long: examples dropped because prompt + solution exceed seq_len (or the
      prompt is empty: the first token is never a target).
    epochs: passes started over `examples` (re-iterable inputs restart when exhausted).
    stopped: `should_stop` ended the run before `steps`.
  """
  trainer: train_step.Trainer
  history: list[dict[str, float]]
  skipped_too_long: int = 0
  epochs: int = 1
  stopped: bool = False


def _batches(examples: Iterable[Example], batch_size: int, seq_len: int, pad_id: int,
             result: SFTResult) -> Iterator[batch_lib.SFTBatch]:
  """Fixed-shape batches; a re-iterable input starts another epoch when exhausted, the
  last batch of an epoch is padded with no-loss rows."""
  restartable = iter(examples) is not examples
  while True:
    used = 0
    prompts, solutions = [], []
    for prompt, solution in examples:
      if not prompt or len(prompt) + len(solution) > seq_len:
        if result.epochs == 1:  # count each dropped example once, not once per epoch
          result.skipped_too_long += 1
        continue
      used += 1
      prompts.append(prompt)
      solutions.append(solution)
      if len(prompts) == batch_size:
        yield batch_lib.pack_sft(prompts, solutions, seq_len=seq_len, pad_id=pad_id)
        prompts, solutions = [], []
    if prompts:
      yield batch_lib.pack_sft(prompts, solutions, seq_len=seq_len, pad_id=pad_id,
                               batch_size=batch_size)
    if not restartable or used == 0:
      return
    result.epochs += 1


def run_sft(model: nnx.Module, mesh: Mesh, sft: SFTConfig, optim: OptimConfig,
            examples: Iterable[Example], *, seq_len: int, pad_id: int = 0,
            steps: int | None = None,
            on_metrics: Callable[[int, dict[str, float]], None] | None = None,
            compiler_options: dict[str, Any] | None = None,
            should_stop: Callable[[], bool] | None = None) -> SFTResult:
  """Runs `steps` (default `sft.steps`) SFT updates over `examples`.

  Args:
    model: the policy on `mesh`; its buffers pass to the returned trainer.
    mesh: the trainer mesh.
    sft: batch size, rate, schedule, micro-batching.
    optim: the RL optimizer settings whose AdamW shape SFT reuses.
    examples: (prompt ids, solution ids) pairs; a list or other re-iterable is cycled for
      more epochs, a one-shot iterator ends the run early when exhausted.
    seq_len: fixed sequence length; longer examples are dropped and counted.
    pad_id: padding token.
    steps: overrides `sft.steps`.
    on_metrics: called with (step, metrics) after each step's metrics reach the host.
    compiler_options: XLA options for the step (see `train_step.Trainer`).
    should_stop: asked before each step; True ends the run there, with the steps done so
      far (e.g. `preempt.StopRequest.is_set` on SIGTERM).

  Returns:
    An `SFTResult`; the trained policy is `result.trainer.model()`.
  """
  steps = sft.steps if steps is None else steps
  trainer = make_trainer(model, mesh, sft, optim, compiler_options)
  result = SFTResult(trainer=trainer, history=[])
  pending: tuple[int, dict] | None = None

  def flush():
    step, metrics = pending
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    result.history.append(host)
    if on_metrics is not None:
      on_metrics(step, host)

  batches = _batches(examples, sft.batch_size, seq_len, pad_id, result)
  for step in range(steps):
    if should_stop is not None and should_stop():
      log.warning("SFT stopped by request after %d of %d steps", step, steps)
      result.stopped = True
      break
    try:
      batch = next(batches)
    except StopIteration:
      log.warning("SFT examples ran out after %d of %d steps", step, steps)
      break
    metrics = trainer.step(batch)
    # Fetch step t-1's metrics only after step t is dispatched: the host never waits for
    # the device between steps.
    if pending is not None:
      flush()
    pending = (step, metrics)
  if pending is not None:
    flush()
  if result.skipped_too_long:
    log.warning("SFT dropped %d examples longer than seq_len=%d", result.skipped_too_long,
                seq_len)
  return result
