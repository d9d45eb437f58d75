"""Per-token log-probabilities of a sequence under the policy, in float32, in chunks.

The trainer's side of the importance ratio pi_train / pi_gen: log-softmax(logits / T) of
each next token, where T is the temperature the sampler drew with (generation/sampling.py
records the same quantity), so both sides describe one distribution. The LM head can run
over a few positions at a time, rematerialised, so the float32 [rows, S, V] logits of a
long sequence never exist at once.
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
  logits_BTV = model.logits(h_BTD, head).astype(jnp.float32)
  if temperature != 1.0:
    # The sampler divides the float32 logits by T before its log-softmax
    # (generation/sampling.py); the same operation here gives the same numbers.
    logits_BTV = logits_BTV / jnp.float32(temperature)
  target_BT = jnp.take_along_axis(logits_BTV, targets_BT[:, :, None], axis=-1)[:, :, 0]
  # target - logsumexp equals gathering log_softmax without a second [B, T, V] array.
  logp_BT = target_BT - jax.nn.logsumexp(logits_BTV, axis=-1)
  top1_BT = target_BT >= jnp.max(logits_BTV, axis=-1)
  return logp_BT, top1_BT


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
  head = functools.partial(_head_logprobs, model, model.head(), temperature=temperature)
  if chunk <= 0 or chunk >= t:
    logp_BT, top1_BT = head(h_BTD, targets_BT)
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
    # Only the chunk's inputs are kept for the backward pass; its [B, c, V] logits are
    # recomputed there.
    one = jax.checkpoint(lambda args: head(*args))
    logp_CBc, top1_CBc = jax.lax.map(one, (h_CBcD, tgt_CBc))
    logp_BT = logp_CBc.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    top1_BT = top1_CBc.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
  logp_BS = jnp.pad(logp_BT, ((0, 0), (1, 0)))
  top1_BS = jnp.pad(top1_BT, ((0, 0), (1, 0)))
  return logp_BS, top1_BS, stats
