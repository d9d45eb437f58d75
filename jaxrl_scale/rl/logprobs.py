"""Per-token log-probabilities of a sequence under the policy, in float32, in chunks.

The trainer's side of the importance ratio pi_train / pi_gen: log-softmax(logits / T) of
each next token, where T is the temperature the sampler drew with (generation/sampling.py
records the same quantity), so both sides describe one distribution. The LM head can run
over a few positions at a time, recomputed in the backward pass (`_recomputed_head`), so
the float32 [rows, S, V] logits of a long sequence never exist at once.

A multi-turn episode is one sequence (prompt, then every model turn with the environment's
tokens between them), so one forward gives the log-prob of every model token of every
turn, each conditioned on the environment's tokens as the sampler's continuation from its
KV cache was; the loss mask (`batch.TrainBatch.loss_mask_PGS`) leaves the environment's
own positions out.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_scale.rl import batch as batch_lib


def _head_logprobs(model: nnx.Module, head: tuple[jax.Array, str], h_BTD: jax.Array,
                   targets_BT: jax.Array, temperature: float) -> tuple[jax.Array, jax.Array]:
  """(log p_T(target), target is the argmax) from hidden states, in float32."""
  w, spec = head
  logp_BT, top1_BT, _ = _logprobs_of(_logits_fn(model, spec), h_BTD, w, targets_BT,
                                     temperature)
  return logp_BT, top1_BT


def _logits_fn(model: nnx.Module, spec: str):
  """(h, w[, operand]) -> the float32 logits of the model's LM head with weights w
  (`operand`: `model.head_operand(w)`, taken once by the caller)."""
  return lambda h_BTD, w, operand=None: model.logits(h_BTD, (w, spec), operand).astype(
      jnp.float32)


def _with_operand(logits_fn, operand: jax.Array | None):
  """logits_fn as a function of (h, w) alone, with `operand` (if any) bound."""
  if operand is None:
    return logits_fn
  return lambda h_BTD, w: logits_fn(h_BTD, w, operand)


def _logprobs_of(logits_fn, h_BTD: jax.Array, w: jax.Array, targets_BT: jax.Array,
                 temperature: float, vocab_axis: str | None = None, one_pass: bool = False
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(log p_T(target), target is the argmax, logsumexp of logits / T).

  `vocab_axis`: inside a shard_map whose devices along that mesh axis each hold a slice of
  the vocabulary (w split there; `_sharded_chunked_head`): the max, the normaliser and the
  target's logit are combined over it. `one_pass`: the max and the normaliser from one read
  of the logits (`max_and_sum_exp`), for callers that do not differentiate this function
  (`_recomputed_head`, which has its own backward: autodiff has no rule for that
  reduction)."""
  logits_BTV = logits_fn(h_BTD, w)
  if temperature != 1.0:
    # The sampler divides the float32 logits by T before its log-softmax
    # (generation/sampling.py); the same operation here gives the same numbers.
    logits_BTV = logits_BTV / jnp.float32(temperature)
  local_BT, inside_BT = _local_targets(targets_BT, logits_BTV.shape[-1], vocab_axis)
  target_BT = jnp.take_along_axis(logits_BTV, local_BT[:, :, None], axis=-1)[:, :, 0]
  # target - logsumexp equals gathering log_softmax without a second [B, T, V] array.
  if vocab_axis is not None:
    target_BT = jax.lax.psum(jnp.where(inside_BT, target_BT, 0.0), vocab_axis)
  if one_pass:
    max_BT, sum_BT = max_and_sum_exp(logits_BTV)
    if vocab_axis is not None:
      local_max_BT, max_BT = max_BT, jax.lax.pmax(max_BT, vocab_axis)
      sum_BT = jax.lax.psum(sum_BT * jnp.exp(local_max_BT - max_BT), vocab_axis)
  else:
    max_BT = jnp.max(logits_BTV, axis=-1)
    if vocab_axis is not None:
      max_BT = jax.lax.pmax(max_BT, vocab_axis)
    sum_BT = jnp.sum(jnp.exp(logits_BTV - max_BT[:, :, None]), axis=-1)
    if vocab_axis is not None:
      sum_BT = jax.lax.psum(sum_BT, vocab_axis)
  lse_BT = max_BT + jnp.log(sum_BT)
  return target_BT - lse_BT, target_BT >= max_BT, lse_BT


def max_and_sum_exp(z: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(max m of z over its last axis, sum of exp(z - m)) in one pass over z: a reduction of
  (running max, sum scaled to it) pairs, so the [..., V] float32 logits are read once, not
  twice (max, then the sum). The sum may differ from the two-pass one in float32 rounding.
  Compiled for an H100, the qwen3_0p6b 32 x 2048 train step's forward head reads its
  chunk's logits (9.3 GiB) once fewer: 641 -> 630 ms kernel by kernel; qwen3_1p7b 16 x
  4096 1.443 -> 1.431 s.

  Autodiff has no rule for this reduction: differentiate a two-pass logsumexp instead."""
  def combine(a, b):
    (m1, s1), (m2, s2) = a, b
    m = jnp.maximum(m1, m2)
    # exp(m_i - m), with 1 where m_i is m: two -inf maxima (empty partials) give 0 * 1, not
    # 0 * exp(nan).
    scale = lambda mi: jnp.exp(jnp.where(mi == m, 0.0, mi - m))
    return m, s1 * scale(m1) + s2 * scale(m2)

  return jax.lax.reduce((z, jnp.ones_like(z)), (jnp.array(-jnp.inf, z.dtype),
                                                 jnp.array(0, z.dtype)),
                        combine, (z.ndim - 1,))


def _local_targets(targets_BT: jax.Array, vocab: int, vocab_axis: str | None
                   ) -> tuple[jax.Array, jax.Array | None]:
  """(targets as indices into this device's vocabulary slice, clipped into it; whether the
  target falls in the slice), or (targets, None) with the whole vocabulary here."""
  if vocab_axis is None:
    return targets_BT, None
  local_BT = targets_BT - jax.lax.axis_index(vocab_axis).astype(targets_BT.dtype) * vocab
  inside_BT = (local_BT >= 0) & (local_BT < vocab)
  return jnp.clip(local_BT, 0, vocab - 1), inside_BT


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 4, 5))
def _recomputed_head(logits_fn, h_BTD: jax.Array, w: jax.Array, targets_BT: jax.Array,
                     temperature: float, vocab_axis: str | None = None,
                     operand: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """`_head_logprobs` of one chunk whose backward pass recomputes the logits once and
  goes straight from them to the head's gradients.

  What `jax.checkpoint` around the head did, without its waste: it kept only the inputs,
  so the backward pass reran the forward (the logits matmul and both reductions over the
  vocabulary) and then autodiff wrote the float32 d(logits) and read it back to cast it for
  the matmuls. Here the forward keeps its logsumexp ([B, T], float32) besides the inputs,
  and the backward computes softmax(z) - onehot from the recomputed logits in the same
  elementwise pass that feeds the head's own backward (`layers.fp32_logits`: its bf16
  pieces): the same gradients (up to float32 rounding), two reductions and a float32
  [B, T, V] write and read fewer per chunk. Compiled for an H100 (no GPU; `plan`), bytes
  accessed by the whole train step: qwen3_0p6b 32 x 2048 (vocab 151936, chunk 512) 1499 ->
  1351 GiB, the sum of its kernels' roofline times 751 -> 703 ms; qwen3_1p7b 16 x 4096 2164
  -> 2015 GiB, 1595 -> 1548 ms. The 8B recipe on v5p-128: 67.12 -> 67.04 GiB, the same
  FLOPs and bound.

  `vocab_axis` (`_logprobs_of`): w holds this device's slice of the vocabulary; the
  returned dh is then this slice's share, which the enclosing shard_map adds up.
  `operand`: what the head multiplies with, cast from w outside the caller's chunk loop
  (`_logits_fn`); it gets no gradient (w does).
  """
  logp_BT, top1_BT, _ = _logprobs_of(_with_operand(logits_fn, operand), h_BTD, w,
                                     targets_BT, temperature, vocab_axis, one_pass=True)
  return logp_BT, top1_BT


def _recomputed_head_fwd(logits_fn, h_BTD, w, targets_BT, temperature, vocab_axis=None,
                         operand=None):
  logp_BT, top1_BT, lse_BT = _logprobs_of(_with_operand(logits_fn, operand), h_BTD, w,
                                          targets_BT, temperature, vocab_axis, one_pass=True)
  return (logp_BT, top1_BT), (h_BTD, w, targets_BT, lse_BT, operand)


def _recomputed_head_bwd(logits_fn, temperature, vocab_axis, res, g):
  h_BTD, w, targets_BT, lse_BT, operand = res
  g_BT = g[0]
  if vocab_axis is not None:
    # The forward's log-probs are one value on every device along the vocabulary axis (a
    # psum); a shard_map (check_vma=False) hands each of them a share of its cotangent,
    # and the transpose of that psum adds the shares back.
    g_BT = jax.lax.psum(g_BT, vocab_axis)
  logits_BTV, vjp = jax.vjp(_with_operand(logits_fn, operand), h_BTD, w)
  inv_t = jnp.float32(1.0 / temperature)
  z_BTV = logits_BTV * inv_t if temperature != 1.0 else logits_BTV
  # d logp / d z = onehot(target) - softmax(z); through z = logits / T.
  local_BT, inside_BT = _local_targets(targets_BT, z_BTV.shape[-1], vocab_axis)
  if inside_BT is not None:
    local_BT = jnp.where(inside_BT, local_BT, -1)  # no target in this slice: no onehot
  onehot_BTV = (jax.lax.broadcasted_iota(targets_BT.dtype, z_BTV.shape, 2)
                == local_BT[:, :, None])
  d_BTV = (g_BT * inv_t)[:, :, None] * (onehot_BTV.astype(jnp.float32)
                                        - jnp.exp(z_BTV - lse_BT[:, :, None]))
  dh_BTD, dw = vjp(d_BTV)
  return dh_BTD, dw, None, None


_recomputed_head.defvjp(_recomputed_head_fwd, _recomputed_head_bwd)


def _chunked_head(logits_fn, h_BTD: jax.Array, w: jax.Array, targets_BT: jax.Array,
                  chunk: int, temperature: float, vocab_axis: str | None = None,
                  activation_sharding: NamedSharding | None = None, operand_fn=None
                  ) -> tuple[jax.Array, jax.Array]:
  """`_recomputed_head` over `chunk` positions at a time (the last chunk padded).
  `operand_fn`: w -> what the head multiplies with (`Transformer.head_operand`), taken
  here once, not in every chunk."""
  b, t = targets_BT.shape
  n = -(-t // chunk)
  pad = n * chunk - t
  h_CBcD = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, -1).swapaxes(0, 1)
  tgt_CBc = jnp.pad(targets_BT, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
  if activation_sharding is not None:
    # Chunks are taken along the sequence: each one stays split by rows like h_BSD.
    row_spec = activation_sharding.spec[0] if activation_sharding.spec else None
    h_CBcD = jax.lax.with_sharding_constraint(h_CBcD, NamedSharding(
        activation_sharding.mesh, PartitionSpec(None, row_spec, None, None)))
  # Only the chunk's inputs and logsumexp are kept for the backward pass; its [B, c, V]
  # logits are recomputed there (`_recomputed_head`).
  operand = None if operand_fn is None else operand_fn(w)
  one = lambda args: _recomputed_head(logits_fn, args[0], w, args[1], temperature,
                                      vocab_axis, operand)
  logp_CBc, top1_CBc = jax.lax.map(one, (h_CBcD, tgt_CBc))
  return (logp_CBc.swapaxes(0, 1).reshape(b, n * chunk)[:, :t],
          top1_CBc.swapaxes(0, 1).reshape(b, n * chunk)[:, :t])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gathered(w: jax.Array, axes: tuple[str, ...], axis: int) -> jax.Array:
  """`all_gather(w)` (tiled, along `axis`) whose transpose reduce-scatters the cotangent
  where it is, in every micro-batch.

  The plain gather's transpose is the same reduce-scatter, but XLA then moved it out of
  the train step's micro-batch loop (one reduction a step instead of one a micro-batch):
  the loop carried the unreduced float32 [V, D] gradient of every micro-batch summed, and
  the reduction after the loop wrote another, two full copies of the head's float32
  gradient on every chip. The optimization barrier keeps the reduction in the loop: the 8B
  recipe on v5p-128 75.33 -> 70.88 GiB per chip, for 2404 -> 2513 GiB of collectives a
  step (`plan`)."""
  return jax.lax.all_gather(w, axes, axis=axis, tiled=True)


def _gathered_fwd(w, axes, axis):
  return _gathered(w, axes, axis), None


def _gathered_bwd(axes, axis, _, ct):
  return (jax.lax.optimization_barrier(
      jax.lax.psum_scatter(ct, axes, scatter_dimension=axis, tiled=True)),)


_gathered.defvjp(_gathered_fwd, _gathered_bwd)


def _sharded_chunked_head(logits_fn, spec: str, h_BTD: jax.Array, w: jax.Array,
                          targets_BT: jax.Array, chunk: int, temperature: float,
                          activation_sharding: NamedSharding | None, operand_fn=None
                          ) -> tuple[jax.Array, jax.Array] | None:
  """The chunked head run by every device on its own rows (a shard_map), or None where the
  mesh is not laid out for it (no row sharding; a mesh axis that splits neither the rows
  nor the vocabulary; a vocabulary that 'tp' does not divide).

  Left to the SPMD partitioner, the chunk loop all-gathered the FSDP-split head weights in
  every chunk (and again in its backward pass) and all-reduced every chunk's float32 [V, D]
  partial gradient: on the 8B recipe (v5p-128, fsdp 16, 32 chunks a micro-batch) 1536
  all-reduces of 2.4 GB and 3072 all-gathers of 1.2 GB a step, 7 TiB over the chip
  interconnect per chip. Here each device gathers the weights once a micro-batch (its
  vocabulary slice over 'tp', like the TP logits), adds its chunks' gradients locally,
  and the transpose of the gather reduce-scatters them once a micro-batch (`_gathered`):
  the step's collectives 8.79 -> 2.45 TiB per chip (`plan`'s collective bytes), for 66.47 ->
  70.88 GiB per chip (the local float32 gradient and the gathered weights live through the
  loop). Scout-shaped on v5p-256 (fsdp 4 x expert 4 x tp 8): 85.38 GiB, bound 53.6 s.
  With 'tp' > 1 the vocabulary stays split over it (Megatron's vocab-parallel
  cross-entropy): the max, the normaliser and the target's logit are combined over 'tp'
  (`_logprobs_of`), and dh's slices added.
  """
  if activation_sharding is None or not activation_sharding.spec:
    return None
  mesh = activation_sharding.mesh
  rows = activation_sharding.spec[0]
  row_axes = (rows,) if isinstance(rows, str) else tuple(rows or ())
  w_axes = spec.split(",")[1].split("->")[0]  # "VD" (tied embedding) or "DV"
  vocab = w.shape[w_axes.index("V")]
  tp = "tp" if mesh.shape.get("tp", 1) > 1 and "tp" not in row_axes else None
  if not row_axes or (tp is not None and vocab % mesh.shape[tp]):
    return None
  if any(size > 1 and axis not in row_axes and axis != tp for axis, size in mesh.shape.items()):
    # Every device along such an axis would compute the same rows, and the transpose
    # would add their (equal) gradients.
    return None
  # The model dim of w comes in split over the row axes (as FSDP keeps it) and is gathered
  # inside, so the transpose reduce-scatters the gradient straight to that split.
  d_axis = w_axes.index("D")
  split_d = w.shape[d_axis] % math.prod(mesh.shape[a] for a in row_axes) == 0
  w_spec = PartitionSpec(*[tp if a == "V" else (rows if a == "D" and split_d else None)
                           for a in w_axes])
  row_spec = PartitionSpec(rows, None)

  def local(h_BTD, targets_BT, w):
    if split_d:
      w = _gathered(w, row_axes, d_axis)
    return _chunked_head(logits_fn, h_BTD, w, targets_BT, chunk, temperature, tp,
                         operand_fn=operand_fn)

  # check_vma=False: the transpose adds the cotangents of inputs not split over an axis
  # (h over 'tp'; w over the rows when its model dim does not split) across it, which is
  # the reduction wanted here.
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(PartitionSpec(rows, None, None), row_spec, w_spec),
                       out_specs=(row_spec, row_spec), check_vma=False)(h_BTD, targets_BT, w)


def token_logprobs(model: nnx.Module, tokens_BS: jax.Array, positions_BS: jax.Array,
                   mask_BS: jax.Array, chunk: int = 0, *, temperature: float = 1.0,
                   remat: str = "none",
                   activation_sharding: NamedSharding | None = None,
                   residual_sharding: NamedSharding | None = None,
                   unroll_layers: bool = False) -> tuple[jax.Array, jax.Array]:
  """log pi_T(tokens[s] | tokens[<s]) at every position s >= 1, and whether it was the argmax.

  pi_T is the policy at temperature T: softmax(logits / T). The LM head runs in float32
  when the model is configured so (`lm_head_fp32`) and the normaliser is taken in float32
  whatever the head's dtype: the importance ratio exp(logp_train - logp_gen) amplifies any
  rounding of either log-prob, and bf16 logits were the instability the ScaleRL paper fixed
  with its "FP32 logits" (notes section 5).

  Args:
    model: the policy.
    tokens_BS, positions_BS, mask_BS: the model inputs (see `batch.TrainBatch`).
    chunk: > 0 computes the LM head over `chunk` positions at a time, rematerialised in
      the backward pass, so the float32 [B, S, V] logits never exist at once (at V = 152k
      and S = 16k they would not fit); 0 does all positions in one go.
    temperature: T > 0; the sampler's temperature for RL, 1 for SFT.
    remat: the decoder layers' rematerialisation policy (`transformer.REMAT_POLICIES`).
    activation_sharding: where [B, S, D] activations live (rows over 'fsdp'); None lets
      the compiler choose.
    residual_sharding: sequence parallelism: where the residual stream lives between
      decoder layers (e.g. S over 'tp'; `Transformer.hidden_states`); None: as
      `activation_sharding`.
    unroll_layers: the layers as an unrolled loop, not a scan (`Transformer.hidden_states`).

  Returns:
    (logp_BS float32, top1_BS bool); position 0 has no prediction and holds 0 / False.
  """
  logp_BS, top1_BS, _ = token_logprobs_and_stats(
      model, tokens_BS, positions_BS, mask_BS, chunk, temperature=temperature, remat=remat,
      activation_sharding=activation_sharding, residual_sharding=residual_sharding,
      unroll_layers=unroll_layers)
  return logp_BS, top1_BS


def token_logprobs_and_stats(model: nnx.Module, tokens_BS: jax.Array, positions_BS: jax.Array,
                             mask_BS: jax.Array, chunk: int = 0, *, temperature: float = 1.0,
                             remat: str = "none",
                             activation_sharding: NamedSharding | None = None,
                             residual_sharding: NamedSharding | None = None,
                             routing_BSLK: jax.Array | None = None, replay: bool = False,
                             unroll_layers: bool = False):
  """`token_logprobs` and the router stats of an MoE policy (`moe.RouterStats`, None for
  a dense one): (logp_BS, top1_BS, stats).

  `routing_BSLK`: the sampler's expert choices aligned with the inputs
  (`batch.TrainBatch.routing_PGSLK`, recorded where `batch.recorded_mask`); the stats then
  count how often this model's own routing differs, and with `replay` the forward routes
  the tokens to the recorded experts (gates from this model's router, so its gradient
  flows through them)."""
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  recorded_BS = None if routing_BSLK is None else batch_lib.recorded_mask(mask_BS)
  h_BSD, stats = model.hidden_states_with_stats(
      tokens_BS, positions_BS, mask_BS, remat=remat, activation_sharding=activation_sharding,
      residual_sharding=residual_sharding, recorded_BTLK=routing_BSLK, recorded_BT=recorded_BS,
      replay=replay, unroll_layers=unroll_layers)
  # The last position predicts past the sequence: never a target, so skip its logits.
  h_BTD, targets_BT = h_BSD[:, :-1], tokens_BS[:, 1:]
  b, t = targets_BT.shape
  # The head's weights are taken once, outside the chunk loop (`Transformer.head`).
  w, spec = model.head()
  if chunk <= 0 or chunk >= t:
    logp_BT, top1_BT = _head_logprobs(model, (w, spec), h_BTD, targets_BT, temperature)
  else:
    logits_fn = _logits_fn(model, spec)
    sharded = _sharded_chunked_head(logits_fn, spec, h_BTD, w, targets_BT, chunk,
                                    temperature, activation_sharding, model.head_operand)
    if sharded is not None:
      logp_BT, top1_BT = sharded
    else:
      logp_BT, top1_BT = _chunked_head(logits_fn, h_BTD, w, targets_BT, chunk, temperature,
                                       activation_sharding=activation_sharding,
                                       operand_fn=model.head_operand)
  logp_BS = jnp.pad(logp_BT, ((0, 0), (1, 0)))
  top1_BS = jnp.pad(top1_BT, ((0, 0), (1, 0)))
  return logp_BS, top1_BS, stats
