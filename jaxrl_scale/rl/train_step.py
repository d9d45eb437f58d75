"""The sharded, jitted train step: micro-batch gradient accumulation, AdamW, NaN skip.

One `Trainer` owns the policy's parameters and optimizer state on the trainer mesh and
runs one compiled step per batch:

    objective = train_step.RLObjective(cfg.rl, temperature=cfg.sampler.temperature)
    trainer = train_step.Trainer(model, mesh, cfg.optim, objective, micro_batches=4)
    metrics = trainer.step(batch)          # device arrays; fetch them one step later

The step is `jax.jit` with explicit in/out shardings (state laid out like the params,
batch rows over 'fsdp'), the optimizer state donated, and is compiled once before the first
step (its `memory_analysis()` is logged). What the step minimises is an `Objective`: the RL
policy loss (`RLObjective`) and the SFT cross-entropy (`rl.sft.SFTObjective`) share all
the machinery.

Micro-batches are slices of the batch's leading axis (prompts), accumulated with
`lax.scan`. Each micro-batch's loss is already divided by the FULL batch's normaliser
(`Objective.totals`), so the summed gradients equal the full-batch gradient exactly, not
an average of micro-batch averages. Prompt i goes to micro-batch i % M (strided) so that
every micro-batch is spread over all data-parallel devices without moving data.

Mixed precision: the Trainer holds float32 master parameters and float32 AdamW moments
whatever the model's `param_dtype` (a bf16 weight of std 0.02 does not move under an
update of lr 5e-7: its spacing there is 1.2e-4); the forward pass computes in the model's
`dtype` (every layer casts its weights) and the log-probs and loss in float32. The sampler
gets a `param_dtype` copy, cast on the trainer's devices (`parallel.transfer`). Every
carried array keeps its dtype and sharding, so the step compiles exactly once.

The compute copy: a weight the model only ever reads rounded to its compute dtype gets its
gradient in that dtype whatever the master's precision, so the step casts such masters to
`param_dtype` once, before the micro-batch loop, differentiates the copy and sums the
micro-batch gradients in float32: the same gradient, but the loop carries half-width
weights and half-width per-micro-batch gradients (Scout-shaped on v5p-256: -3.1 GiB per
chip). Weights the model reads in float32 or whose gradient it sums in their own dtype are
marked `float32_grad` where the model creates them (`models.layers.param`: the router, the
embedding, the FP32 LM head) and stay float32 masters in the loop.

Log-probs (`rl.logprobs`) are those of the distribution the sampler drew from:
log-softmax(logits / T), T = the sampler's temperature (`RLObjective(rl, temperature=...)`).

Memory: decoder layers are rematerialised (`optim.remat`), activations stay split by batch
rows over 'fsdp' (`activation_sharding`), with `optim.sequence_parallel` the residual
stream between layers is split along the sequence over 'tp' as well (`residual_sharding`),
and the LM head runs over `optim.logits_chunk` positions at a time so the float32
[rows, S, V] logits never exist.

Ahead-of-time: a Trainer built from an ABSTRACT model (`nnx.Param` leaves that are
`jax.ShapeDtypeStruct`s with a `sharding`) allocates nothing; `lower(batch_struct)` gives
the exact program `step` would run, for `jaxrl-scale plan` to compile for a TPU topology:

    trainer = train_step.Trainer(abstract_model, mesh, cfg.optim, objective, micro_batches=M)
    compiled = trainer.lower(batch_struct).compile()   # memory_analysis(), cost_analysis()

Donation: the step donates the optimizer state (and step count), not the parameters. The
new parameters go to fresh buffers, which XLA uses as scratch for the gradient sum before
it writes them; the old ones are freed when the trainer drops them after the step. Against
donating everything, the Scout-shaped step needs 0.5x its float32 parameters less HBM per
chip (the donated masters were read inside the micro-batch loop, then overwritten in place,
which made the compiler hold more of them; `docs/models.md`). The caller's model object may
share the master buffers (a float32 model): do not update it afterwards; `Trainer.model()`
gives a live view.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_scale.config import OptimConfig, RLConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import layers
from jaxrl_scale.rl import aggregation
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import logprobs as logprobs_lib
from jaxrl_scale.rl import losses
from jaxrl_scale.rl import optimizer as optimizer_lib
from jaxrl_scale.rl import placement
from jaxrl_scale.rl.placement import (DATA_AXIS, _array_shardings, _compute_dtypes,  # noqa: F401
                                      _data_axes, _data_spec, _has_router, _is_abstract,
                                      _structs, _to_master, cpu_program, master_dtype,
                                      put_global)

log = logging.getLogger(__name__)



@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """Everything the step updates (the step donates `step` and `opt_state`).

  Attributes:
    step: int32 [], optimizer updates applied so far (skipped non-finite steps excluded).
    params: the model's `nnx.Param` state.
    opt_state: the optax state, sharded like `params`.
  """
  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState


def _rows(x: jax.Array, example_dims: int) -> jax.Array:
  """[*example dims, S] -> [rows, S]."""
  return x.reshape((math.prod(x.shape[:example_dims]),) + x.shape[example_dims:])


# --------------------------------------------------------------------------------------
# Objectives.


class Objective(Protocol):
  """What a train step minimises.

  `example_dims` leading axes of every batch array index examples ((P, G) for RL, (B,)
  for SFT); micro-batches slice the first of them. `temperature` is the T of the
  log-probs the loss sees, log-softmax(logits / T).
  """

  example_dims: int
  temperature: float

  def model_inputs(self, batch: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(tokens, positions, input_mask), each [*example dims, S]."""

  def totals(self, batch: Any) -> Any:
    """Normalisers computed once on the FULL batch (a pytree of arrays)."""

  def micro_loss(self, logp: jax.Array, top1: jax.Array, micro: Any, totals: Any) -> jax.Array:
    """One micro-batch's share of the full-batch loss (divided by `totals`)."""

  def metrics(self, logp: jax.Array, top1: jax.Array, batch: Any,
              totals: Any) -> dict[str, jax.Array]:
    """Scalars over the full batch, from the stop-gradient token log-probs of all
    micro-batches (so ratio quantiles are exact, not combined per micro-batch)."""


class RLObjective:
  """The registered policy loss (`rl.loss`) with its aggregation (`rl.aggregation`).

  Args:
    rl: the loss settings.
    temperature: the sampler's temperature (`sampler.temperature`): the importance ratio
      divides the trainer's probability by the sampler's recorded one, which is of
      softmax(logits / T). 0 (greedy) records untempered log-probs, so it means T = 1 here.
    replay_routing: an MoE policy's forward sends each token to the experts the sampler
      chose (the batch's `routing_PGSLK`, when it has one) instead of its own top-k
      (`model.routing: replay`).
  """

  example_dims = 2

  def __init__(self, rl: RLConfig, *, temperature: float, replay_routing: bool = False):
    self.replay_routing = bool(replay_routing)
    if temperature < 0:
      raise UserError(f"config key 'sampler.temperature': must be >= 0, got {temperature}")
    self.temperature = float(temperature) if temperature > 0 else 1.0
    self.aggregation = rl.aggregation
    self.loss_fn = losses.make_policy_loss(rl.loss, losses.params_from_config(rl),
                                           rl.aggregation)

  def model_inputs(self, batch: batch_lib.TrainBatch):
    return batch.tokens_PGS, batch.positions_PGS, batch.input_mask_PGS

  def totals(self, batch: batch_lib.TrainBatch) -> jax.Array:
    return aggregation.denominator(self.aggregation, batch.loss_mask_PGS, batch.weight_PG)

  def micro_loss(self, logp, top1, micro: batch_lib.TrainBatch, totals) -> jax.Array:
    del top1
    loss, _ = self.loss_fn(logp, micro.loss_batch(), total_units=totals)
    return loss

  def metrics(self, logp, top1, batch: batch_lib.TrainBatch, totals) -> dict[str, jax.Array]:
    del top1
    _, diag = self.loss_fn(logp, batch.loss_batch(), total_units=totals)
    diag["loss_units"] = jnp.asarray(totals, jnp.float32)
    return diag


def micro_batches_for(optim: OptimConfig, num_prompts: int, rows_per_prompt: int = 1,
                      mesh: Mesh | None = None) -> int:
  """M from `optim.micro_batch_prompts` (0 = one micro-batch of all prompts).

  With the trainer `mesh` (and G as `rows_per_prompt`), M is lowered where a micro-batch's
  rows would not split over the data-parallel chips (`placement.shardable_micro_batches`):
  1 prompt of 16 rows on 32 chips becomes 2 prompts a micro-batch, one row a chip.
  """
  per = optim.micro_batch_prompts
  if per == 0:
    return 1
  if num_prompts % per:
    raise UserError(f"config key 'optim.micro_batch_prompts': {per} does not divide the "
                    f"{num_prompts} prompts of a batch")
  m = num_prompts // per
  if mesh is None:
    return m
  return placement.shardable_micro_batches(num_prompts, rows_per_prompt, m, mesh)


# --------------------------------------------------------------------------------------
# The trainer.


class Trainer:
  """A compiled-once, sharded train step over a model's parameters.

  Args:
    model: the policy, its parameters already placed on `mesh` (on a 1x1 mesh a model on
      the default device is accepted as is), in any float dtype: the trainer keeps float32
      masters. Its buffers are donated: use `model()`. An abstract model (every leaf a
      `jax.ShapeDtypeStruct` with a `sharding` on `mesh`) builds an abstract trainer that
      can `lower` / `compile` but not `step`.
    mesh: the trainer mesh, axes ('fsdp', 'tp').
    optim: optimizer settings (AdamW, warmup, clipping), the remat policy and logits chunk.
    objective: `RLObjective`, `sft.SFTObjective` or a fork's own.
    micro_batches: M; the batch's leading axis must be divisible by it.
    compiler_options: XLA options for the step, e.g. {"xla_backend_optimization_level": 0}
      halves CPU compile time in tests.
  """

  def __init__(self, model: nnx.Module, mesh: Mesh, optim: OptimConfig, objective: Objective,
               micro_batches: int = 1, compiler_options: dict[str, Any] | None = None):
    if micro_batches < 1:
      raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    self.mesh = mesh
    self.objective = objective
    self.micro_batches = micro_batches
    self.compiler_options = compiler_options
    self.logits_chunk = optim.logits_chunk
    self.remat = optim.remat
    self.sequence_parallel = optim.sequence_parallel
    model_coef = getattr(getattr(model, "cfg", None), "router_aux_loss_coef", 0.0)
    self.router_aux_coef = float(model_coef if optim.router_aux_loss_coef is None
                                 else optim.router_aux_loss_coef)
    self.tx, self.schedule = optimizer_lib.make_optimizer(optim)
    self.graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
    self._compute_dtypes = _compute_dtypes(params, getattr(getattr(model, "cfg", None),
                                                           "dtype", None))
    self.abstract = _is_abstract((params, self._rest))
    # XLA:CPU programs (`placement.cpu_program`): the layers unrolled, the projections as
    # 2-D matmuls. Attributes, so a benchmark can build the step with either off.
    self.unroll_layers = self.flat_projections = cpu_program(mesh)
    self._replicated = NamedSharding(mesh, PartitionSpec())
    self.param_shardings = _array_shardings(params, mesh)
    self._rest_shardings = _array_shardings(self._rest, mesh)
    master = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, master_dtype(x.dtype)), params)
    opt_shardings = optimizer_lib.state_shardings(self.tx, master, self.param_shardings, mesh)
    self.state_shardings = TrainState(step=self._replicated, params=self.param_shardings,
                                      opt_state=opt_shardings)
    if self.abstract:
      # Shapes, dtypes and shardings only (jax.eval_shape): nothing is allocated.
      self._rest = _structs(self._rest, self._rest_shardings)
      self.state = _structs(TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=master,
                                       opt_state=jax.eval_shape(self.tx.init, master)),
                            self.state_shardings)
    else:
      params = _to_master(params, self.param_shardings)
      # Created straight into its sharded layout, before the first step.
      opt_state = optimizer_lib.init_sharded(self.tx, params, opt_shardings)
      self.state = TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), self._replicated),
                              params=params, opt_state=opt_state)
    self.trace_count = 0  # bumped each time the step function is traced
    self.compile_count = 0  # step programs compiled (1 in a healthy run)
    self.memory_analysis = None
    self._jitted = None
    self._compiled = None
    self._loss_and_grads = None
    self._batch_shardings = None
    self._data_spec = None
    self._compiled_shapes = None

  # ---- batch placement -----------------------------------------------------------------

  def batch_shardings(self, batch) -> Any:
    """NamedShardings for a batch of this shape: one example axis over 'fsdp'."""
    leaves = jax.tree.leaves(batch)
    leading = leaves[0].shape[:self.objective.example_dims] if leaves else ()
    if not leading or 0 in leading:
      raise UserError(f"an empty batch (example axes {tuple(leading)}): nothing to train on; "
                      "a step needs at least one prompt with one completion")
    m = self.micro_batches
    if leading[0] % m:
      raise UserError(f"config key 'optim.micro_batch_prompts' (or 'sft.micro_batch_size'): "
                      f"the batch's {leading[0]} prompts do not split into {m} micro-batches")
    rows, n = leading[0] // m * math.prod(leading[1:]), placement.data_shards(self.mesh)
    if rows % n:
      # Not an error (tiny batches on 8 CPU devices), but at scale every chip computing the
      # whole micro-batch is what stops a step fitting (`micro_batches_for` avoids it).
      log.warning("a micro-batch's %d rows do not split over the trainer's %d data-parallel "
                  "devices: each computes all of them", rows, n)
    spec = _data_spec((leading[0] // m,) + tuple(leading[1:]), self.mesh)
    self._data_spec = spec
    return jax.tree.map(lambda _: NamedSharding(self.mesh, PartitionSpec(*spec)), batch)

  def _fixed_batch_shardings(self, batch) -> Any:
    """The batch shardings of the first batch seen; every later batch must match."""
    if self._batch_shardings is None:
      self._batch_shardings = self.batch_shardings(batch)
    return self._batch_shardings

  def shard_batch(self, batch):
    """Places a host (NumPy) batch on the trainer mesh.

    With a trainer mesh over several processes, `batch` is the GLOBAL batch, identical in
    every process; each process copies only the rows of its own devices (`put_global`).
    """
    return put_global(batch, self._fixed_batch_shardings(batch))

  # ---- the step --------------------------------------------------------------------------

  def _split_micro(self, x: jax.Array) -> jax.Array:
    """[P, ...] -> [M, P / M, ...] with prompt i in micro-batch i % M."""
    m = self.micro_batches
    x = x.reshape((x.shape[0] // m, m) + x.shape[1:])
    x = jnp.swapaxes(x, 0, 1)
    spec = PartitionSpec(None, *self._data_spec)
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

  def _merge_micro(self, x_M: jax.Array) -> jax.Array:
    """Inverse of `_split_micro`."""
    x = jnp.swapaxes(x_M, 0, 1)
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

  def activation_sharding(self, rows: int) -> NamedSharding | None:
    """Where a micro-batch's [rows, S, D] activations live: rows over 'fsdp' when they
    divide. Without the constraint, sharding propagation follows the fsdp-split weights and
    copies the whole micro-batch to every chip (measured: 74.4 vs 9.4 GiB per chip)."""
    axes = _data_axes(self.mesh)
    if rows % placement.data_shards(self.mesh):
      return None
    return NamedSharding(self.mesh, PartitionSpec(axes if len(axes) > 1 else DATA_AXIS,
                                                  None, None))

  def residual_sharding(self, rows: int, seq: int) -> NamedSharding | None:
    """Where the residual stream between decoder layers lives with `optim.sequence_parallel`:
    like `activation_sharding` with the S axis over 'tp' (Megatron-style sequence
    parallelism). With remat "full" each layer keeps its [rows, S, D] input for the backward
    pass, and without this every tp chip holds all S of it. None (as without it) when the
    flag is off or the mesh has no 'tp' axis of more than one device."""
    tp = self.mesh.shape.get("tp", 1)
    if not self.sequence_parallel or tp == 1:
      return None
    if seq % tp:
      raise UserError(f"config key 'optim.sequence_parallel': the sequence length {seq} does "
                      f"not split over the trainer's tp={tp}")
    whole = self.activation_sharding(rows)
    return NamedSharding(self.mesh, PartitionSpec(whole.spec[0] if whole else None, "tp", None))

  def _grads(self, params, rest, micro, totals):
    """(loss, grads, logp, top1, routing) of one micro-batch; grads float32 like the
    masters; routing: (mismatched, compared) recorded expert choices, float32 sums (zeros
    without routing records)."""
    dims = self.objective.example_dims

    def loss_of(p):
      model = nnx.merge(self.graphdef, p, rest)
      tokens, positions, mask = self.objective.model_inputs(micro)
      tokens_R = _rows(tokens, dims)
      routing = getattr(micro, "routing_PGSLK", None)
      logp_R, top1_R, stats = logprobs_lib.token_logprobs_and_stats(
          model, tokens_R, _rows(positions, dims), _rows(mask, dims), chunk=self.logits_chunk,
          temperature=self.objective.temperature, remat=self.remat,
          activation_sharding=self.activation_sharding(tokens_R.shape[0]),
          residual_sharding=self.residual_sharding(*tokens_R.shape),
          routing_BSLK=None if routing is None else _rows(routing, dims),
          replay=getattr(self.objective, "replay_routing", False),
          unroll_layers=self.unroll_layers)
      logp = logp_R.reshape(tokens.shape)
      top1 = top1_R.reshape(tokens.shape)
      zero = jnp.zeros((), jnp.float32)
      counts = ((zero, zero, zero) if stats is None else
                (stats.mismatch, stats.compared, stats.load_balancing_loss()))
      loss = self.objective.micro_loss(logp, top1, micro, totals)
      if stats is not None and self.router_aux_coef > 0:
        # The family's load-balancing term (e.g. Qwen3-MoE's 0.001), averaged over the
        # micro-batches like the policy loss is summed to the batch's.
        loss = loss + self.router_aux_coef * counts[2] / self.micro_batches
      return loss, (logp, top1, counts)

    with layers.flat_projections(self.flat_projections):  # loss_of is traced in here
      (loss, (logp, top1, counts)), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    return loss, grads, logp, top1, counts

  def _compute_copy(self, params):
    """The weights the forward pass reads: a param_dtype copy of every float32 master the
    model only reads rounded to param_dtype, the master itself for the rest (module
    docstring, "The compute copy")."""
    leaves, treedef = jax.tree.flatten(params)
    return jax.tree.unflatten(treedef, [x if d is None else x.astype(d)
                                        for x, d in zip(leaves, self._compute_dtypes)])

  def _accumulate(self, params, rest, batch, totals):
    """(loss, float32 grads, logp, top1, routing counts) of the full batch, summed over
    micro-batches; `params` are the float32 masters."""
    compute = self._compute_copy(params)
    to_f32 = lambda grads: jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    if self.micro_batches == 1:
      loss, grads, logp, top1, counts = self._grads(compute, rest, batch, totals)
      return loss, to_f32(grads), logp, top1, counts
    micro_M = jax.tree.map(self._split_micro, batch)
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    zeros = jax.lax.with_sharding_constraint(zeros, self.param_shardings)

    def body(carry, micro):
      loss_sum, grad_sum, counts_sum = carry
      loss, grads, logp, top1, counts = self._grads(compute, rest, micro, totals)
      grad_sum = jax.tree.map(jnp.add, grad_sum, to_f32(grads))
      counts_sum = jax.tree.map(jnp.add, counts_sum, counts)
      return (loss_sum + loss, grad_sum, counts_sum), (logp, top1)

    zero = jnp.zeros((), jnp.float32)
    (loss, grads, counts), (logp_M, top1_M) = jax.lax.scan(
        body, (zero, zeros, (zero, zero, zero)), micro_M)
    return loss, grads, self._merge_micro(logp_M), self._merge_micro(top1_M), counts

  def _step(self, state: TrainState, rest, batch) -> tuple[TrainState, dict[str, jax.Array]]:
    self.trace_count += 1
    totals = self.objective.totals(batch)
    params = state.params
    loss, grads, logp, top1, (mismatched, compared, balance) = self._accumulate(
        params, rest, batch, totals)
    metrics = self.objective.metrics(jax.lax.stop_gradient(logp), top1, batch, totals)
    if self.graphdef is not None and _has_router(params):
      # The router's load balance (its minimum, experts_per_token, is perfect balance),
      # logged whether or not it is in the loss: a collapsing router shows here first.
      metrics["load_balancing_loss"] = jax.lax.stop_gradient(balance) / self.micro_batches
    if getattr(batch, "routing_PGSLK", None) is not None:
      # Of the sampler's recorded (token, sparse layer, slot) expert choices, the fraction
      # the trainer's own top-k would not make (with replay too: how much replay changed).
      metrics["routing_mismatch"] = mismatched / jnp.maximum(compared, 1.0)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt = self.tx.update(grads, state.opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # A non-finite loss or gradient would poison Adam's moments for good: keep the old
    # state and report it; the training loop decides when to give up.
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_state = TrainState(step=state.step + finite.astype(jnp.int32),
                           params=keep(new_params, params),
                           opt_state=keep(new_opt, state.opt_state))
    _, _, mask = self.objective.model_inputs(batch)
    metrics.update(
        loss=loss,
        grad_norm=grad_norm,
        update_norm=jnp.where(finite, optax.tree.norm(updates), 0.0),
        param_norm=optax.tree.norm(new_state.params),
        lr=jnp.asarray(self.schedule(state.step), jnp.float32),
        tokens=jnp.sum(mask).astype(jnp.float32),
        nonfinite=jnp.logical_not(finite),
    )
    return new_state, metrics

  def lower(self, batch) -> jax.stages.Lowered:
    """The step program for batches shaped like `batch`, lowered but not compiled.

    Exactly the program `step` runs (same shardings, donation and compiler options); on an
    abstract trainer it is how `jaxrl-scale plan` compiles the step for a TPU topology.

    Args:
      batch: a batch (e.g. `batch.TrainBatch`) of NumPy / jax arrays or of
        `jax.ShapeDtypeStruct`s without shardings; the trainer assigns its own.
    """
    batch_shardings = self._fixed_batch_shardings(batch)
    shardings = self.state_shardings
    if self._jitted is None:
      self._jitted = jax.jit(
          _donating_optimizer_state(self._step),
          in_shardings=(shardings.params, (shardings.step, shardings.opt_state),
                        self._rest_shardings, batch_shardings),
          out_shardings=(shardings, self._replicated),
          donate_argnums=(1,), compiler_options=self.compiler_options)
    return self._jitted.lower(*_split_state(_structs(self.state, shardings)),
                              _structs(self._rest, self._rest_shardings),
                              _structs(batch, batch_shardings))

  def compile(self, batch) -> jax.stages.Compiled:
    """Compiles the step for this batch shape (via `lower`); logs its memory analysis.

    Called by the first `step`; call it earlier to fail fast on out-of-memory.
    """
    compiled = self.lower(batch).compile()
    self.compile_count += 1
    self.memory_analysis = compiled.memory_analysis()
    log.info("train step compiled: %s", _describe_memory(self.memory_analysis))
    if not self.abstract:
      self._compiled = compiled
      self._compiled_shapes = _shapes(batch)
    return compiled

  def step(self, batch) -> dict[str, jax.Array]:
    """One optimizer update on `batch` (NumPy or already sharded); returns device scalars.

    Fetch the metrics after starting the next step, so logging never stalls the device.
    """
    self._require_concrete("step")
    if self._compiled is None:
      self.compile(batch)
    shapes = _shapes(batch)
    if shapes != self._compiled_shapes:
      # A new shape would need a second compile (minutes for a large model).
      raise ValueError(f"batch shapes {shapes} differ from the compiled "
                       f"{self._compiled_shapes}; pad every batch to one fixed shape "
                       "(batch.pack_rl num_prompts)")
    batch = self.shard_batch(batch)
    # The compiled executable itself, not the jit wrapper: a state whose dtypes or
    # shardings drifted is an error here instead of a silent second compile.
    self.state, metrics = self._compiled(*_split_state(self.state), self._rest, batch)
    return metrics

  def loss_and_grads(self, batch) -> tuple[jax.Array, nnx.State]:
    """The full-batch loss and float32 gradients at the current parameters, through the
    same micro-batch accumulation as `step` but without an update (for checks and
    debugging; compiled separately, nothing donated)."""
    self._require_concrete("loss_and_grads")
    batch = self.shard_batch(batch)
    if self._loss_and_grads is None:

      def fn(params, rest, batch):
        totals = self.objective.totals(batch)
        loss, grads = self._accumulate(params, rest, batch, totals)[:2]
        return loss, grads

      self._loss_and_grads = jax.jit(
          fn, in_shardings=(self.param_shardings, self._rest_shardings, self._batch_shardings),
          out_shardings=(self._replicated, self.param_shardings),
          compiler_options=self.compiler_options)
    return self._loss_and_grads(self.state.params, self._rest, batch)

  def cache_size(self) -> int:
    """Step programs compiled so far (1 when shapes, dtypes and shardings never change)."""
    return self.compile_count

  def _require_concrete(self, what: str) -> None:
    if self.abstract:
      raise RuntimeError(f"Trainer.{what}: this trainer was built from an abstract model "
                         "(ShapeDtypeStructs, no device memory); it can only lower() and "
                         "compile() the step")

  # ---- views -------------------------------------------------------------------------------

  @property
  def params(self) -> nnx.State:
    """The float32 master parameters."""
    return self.state.params

  def model(self) -> nnx.Module:
    """The policy with the current (float32 master) parameters.

    It shares the parameter buffers (the next `step` writes new ones; holding this model
    keeps the old ones alive) but not the Variable objects, so updating the returned model
    (e.g. an `nnx.jit` round trip) never swaps arrays inside the trainer's state.
    """
    params, rest = jax.tree.map(lambda x: x, (self.state.params, self._rest))
    return nnx.merge(self.graphdef, params, rest)


def _split_state(state: TrainState) -> tuple[nnx.State, tuple[jax.Array, optax.OptState]]:
  """(params, (step, opt_state)): the step program's first two arguments; it donates the
  second."""
  return state.params, (state.step, state.opt_state)


def _donating_optimizer_state(step_fn):
  """`step_fn(state, rest, batch)` as `fn(params, (step, opt_state), rest, batch)`, for a jit
  that donates only its second argument (module docstring, "Donation")."""

  def fn(params, counters, rest, batch):
    step, opt_state = counters
    return step_fn(TrainState(step=step, params=params, opt_state=opt_state), rest, batch)

  return fn


def _shapes(batch) -> list[tuple[tuple[int, ...], str]]:
  return [(tuple(x.shape), str(jax.dtypes.canonicalize_dtype(x.dtype)))
          for x in jax.tree.leaves(batch)]


def _describe_memory(stats) -> str:
  if stats is None:
    return "memory analysis unavailable"
  gib = lambda n: f"{n / 2**30:.3f} GiB"
  return (f"arguments {gib(stats.argument_size_in_bytes)}, outputs "
          f"{gib(stats.output_size_in_bytes)}, aliased {gib(stats.alias_size_in_bytes)}, "
          f"temporaries {gib(stats.temp_size_in_bytes)}")

