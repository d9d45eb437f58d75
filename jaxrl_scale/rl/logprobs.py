"""Per-token log-probabilities of a sequence under the policy, in float32, in chunks.

The trainer's side of the importance ratio pi_train / pi_gen: log-softmax(logits / T) of
each next token, where T is the temperature the sampler drew with (generation/sampling.py
records the same quantity), so both sides describe one distribution. The LM head can run
over a few positions at a time, recomputed in the backward pass (`_recomputed_head`), so
the float32 [rows, S, V] logits of a long sequence never exist at once.
"""

from __future__ import annotations

import functools

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
  """(h, w) -> the float32 logits of the model's LM head with weights w."""
  return lambda h_BTD, w: model.logits(h_BTD, (w, spec)).astype(jnp.float32)


def _logprobs_of(logits_fn, h_BTD: jax.Array, w: jax.Array, targets_BT: jax.Array,
                 temperature: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(log p_T(target), target is the argmax, logsumexp of logits / T)."""
  logits_BTV = logits_fn(h_BTD, w)
  if temperature != 1.0:
    # The sampler divides the float32 logits by T before its log-softmax
    # (generation/sampling.py); the same operation here gives the same numbers.
    logits_BTV = logits_BTV / jnp.float32(temperature)
  target_BT = jnp.take_along_axis(logits_BTV, targets_BT[:, :, None], axis=-1)[:, :, 0]
  # target - logsumexp equals gathering log_softmax without a second [B, T, V] array.
  max_BT = jnp.max(logits_BTV, axis=-1)
  lse_BT = max_BT + jnp.log(jnp.sum(jnp.exp(logits_BTV - max_BT[:, :, None]), axis=-1))
  return target_BT - lse_BT, target_BT >= max_BT, lse_BT


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 4))
def _recomputed_head(logits_fn, h_BTD: jax.Array, w: jax.Array, targets_BT: jax.Array,
                     temperature: float) -> tuple[jax.Array, jax.Array]:
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
  """
  logp_BT, top1_BT, _ = _logprobs_of(logits_fn, h_BTD, w, targets_BT, temperature)
  return logp_BT, top1_BT


def _recomputed_head_fwd(logits_fn, h_BTD, w, targets_BT, temperature):
  logp_BT, top1_BT, lse_BT = _logprobs_of(logits_fn, h_BTD, w, targets_BT, temperature)
  return (logp_BT, top1_BT), (h_BTD, w, targets_BT, lse_BT)


def _recomputed_head_bwd(logits_fn, temperature, res, g):
  h_BTD, w, targets_BT, lse_BT = res
  g_BT = g[0]
  logits_BTV, vjp = jax.vjp(logits_fn, h_BTD, w)
  inv_t = jnp.float32(1.0 / temperature)
  z_BTV = logits_BTV * inv_t if temperature != 1.0 else logits_BTV
  # d logp / d z = onehot(target) - softmax(z); through z = logits / T.
  onehot_BTV = (jax.lax.broadcasted_iota(targets_BT.dtype, z_BTV.shape, 2)
                == targets_BT[:, :, None])
  d_BTV = (g_BT * inv_t)[:, :, None] * (onehot_BTV.astype(jnp.float32)
                                        - jnp.exp(z_BTV - lse_BT[:, :, None]))
  dh_BTD, dw = vjp(d_BTV)
  return dh_BTD, dw, None


_recomputed_head.defvjp(_recomputed_head_fwd, _recomputed_head_bwd)


def token_logprobs(model: nnx.Module, tokens_BS: jax.Array, positions_BS: jax.Array,
                   mask_BS: jax.Array, chunk: int = 0, *, temperature: float = 1.0,
                   remat: str = "none",
                   activation_sharding: NamedSharding | None = None,
                   residual_sharding: NamedSharding | None = None,
                   ) -> tuple[jax.Array, jax.Array]:
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

  Returns:
    (logp_BS float32, top1_BS bool); position 0 has no prediction and holds 0 / False.
  """
  logp_BS, top1_BS, _ = token_logprobs_and_stats(
      model, tokens_BS, positions_BS, mask_BS, chunk, temperature=temperature, remat=remat,
      activation_sharding=activation_sharding, residual_sharding=residual_sharding)
  return logp_BS, top1_BS


def token_logprobs_and_stats(model: nnx.Module, tokens_BS: jax.Array, positions_BS: jax.Array,
                             mask_BS: jax.Array, chunk: int = 0, *, temperature: float = 1.0,
                             remat: str = "none",
                             activation_sharding: NamedSharding | None = None,
                             residual_sharding: NamedSharding | None = None,
                             routing_BSLK: jax.Array | None = None, replay: bool = False):
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
      residual_sharding=residual_sharding, recorded_BTLK=routing_BSLK, recorded_BT=recorded_BS, replay=replay)
  # The last position predicts past the sequence: never a target, so skip its logits.
  h_BTD, targets_BT = h_BSD[:, :-1], tokens_BS[:, 1:]
  b, t = targets_BT.shape
  # The head's weights are taken once, outside the chunk loop (`Transformer.head`).
  w, spec = model.head()
  if chunk <= 0 or chunk >= t:
    logp_BT, top1_BT = _head_logprobs(model, (w, spec), h_BTD, targets_BT, temperature)
  else:
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
    logits_fn = _logits_fn(model, spec)
    one = lambda args: _recomputed_head(logits_fn, args[0], w, args[1], temperature)
    logp_CBc, top1_CBc = jax.lax.map(one, (h_CBcD, tgt_CBc))
    logp_BT = logp_CBc.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    top1_BT = top1_CBc.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
  logp_BS = jnp.pad(logp_BT, ((0, 0), (1, 0)))
  top1_BS = jnp.pad(top1_BT, ((0, 0), (1, 0)))
  return logp_BS, top1_BS, stats
