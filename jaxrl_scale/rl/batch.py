"""Fixed-shape training batches: the RL batch the pipeline fills and the SFT batch.

RL layout: [P, G, S] = prompts x generations per prompt x sequence positions, the
layout of `jaxrl_scale.rl.losses` (micro-batches are slices along P, so a prompt's G
completions stay together). Each row holds one full sequence, prompt then completion,
right-padded to S:

    position      0 .. Lp-1         Lp .. Lp+Lc-1        Lp+Lc .. S-1
    tokens        prompt tokens     completion tokens     pad_id
    input_mask    1                 1                     0
    loss_mask     0                 1 (0 on forced-       0
                                    interruption and
                                    environment tokens)
    gen_logp      0                 sampler log-prob      0

Every per-token array is aligned with `tokens`: `gen_logp_PGS[p, g, s]` is the generator's
log pi(tokens[s] | tokens[<s]), and the trainer's log-prob at s is read from the logits at
s - 1. So `loss_mask[..., 0]` is always 0. Forced-interruption tokens were written by the
pipeline, and an environment's tokens (a multi-turn episode's tool results, feedback, next
user turn) by the environment, not sampled from pi_gen: they have no ratio and take no
gradient (`Completion.trainable` is False there); they still condition what follows, as
the sampler saw them. A multi-turn episode is one row: the trainer's forward over the
whole sequence gives the log-prob of every model token of every turn. Neither does a
token whose generator log-prob is not finite take gradient (gen_logp 0, loss_mask 0
there): the RL batcher drops such a token's whole group, and the loss guards against it
too (losses.policy_loss).

Unused rows (padding prompts that keep the shape fixed) have weight 0 and input_mask 0.

Routing records of an MoE sampler (`Completion.routing`), when given, ride along as
routing_PGSLK [P, G, S, L, K] (L sparse layers, top-K), aligned with the trainer's INPUTS:
position s holds the experts the sampler sent tokens[s] to, for s < Lp + Lc - 1 (the last
token was never fed); zeros elsewhere. `recorded_mask` says which positions hold one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.rl import losses


def _pytree_dataclass(cls):
  """A frozen dataclass whose fields are all pytree children (arrays)."""
  cls = dataclasses.dataclass(frozen=True)(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  return jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])


@_pytree_dataclass
class TrainBatch:
  """One RL step's data; see the module docstring for the layout.

  Attributes:
    tokens_PGS: int32 token ids.
    positions_PGS: int32 RoPE positions (0-based from the first prompt token).
    input_mask_PGS: int32, 1 on real tokens (prompt and completion), 0 on padding.
    loss_mask_PGS: float32, 1 on completion tokens that take gradient (the policy's own
      tokens: not forced, not written by an environment).
    gen_logp_PGS: float32 generator log-prob of each completion token.
    advantages_PG: float32 advantage of each completion.
    weight_PG: float32, 0 drops a completion (filtered prompt, padding row).
    prompt_id_PG: int32 dataset index of the prompt (-1 for padding), for logging and the
      curriculum; the loss never reads it.
    routing_PGSLK: the sampler's expert choices (module docstring), uint8 / int16; None
      without routing records.
  """
  tokens_PGS: jax.Array
  positions_PGS: jax.Array
  input_mask_PGS: jax.Array
  loss_mask_PGS: jax.Array
  gen_logp_PGS: jax.Array
  advantages_PG: jax.Array
  weight_PG: jax.Array
  prompt_id_PG: jax.Array
  routing_PGSLK: jax.Array | None = None

  def loss_batch(self) -> losses.LossBatch:
    """The arrays `losses.policy_loss` reads."""
    return losses.LossBatch(logp_gen_PGT=self.gen_logp_PGS, advantages_PG=self.advantages_PG,
                            mask_PGT=self.loss_mask_PGS, weight_PG=self.weight_PG)


@_pytree_dataclass
class SFTBatch:
  """(prompt, solution) pairs, [B, S], same alignment as `TrainBatch`.

  Attributes:
    tokens_BS: int32 prompt then solution, right-padded.
    positions_BS: int32 RoPE positions.
    input_mask_BS: int32, 1 on real tokens.
    loss_mask_BS: float32, 1 on solution tokens (the cross-entropy targets).
  """
  tokens_BS: jax.Array
  positions_BS: jax.Array
  input_mask_BS: jax.Array
  loss_mask_BS: jax.Array


def recorded_mask(input_mask_BS: jax.Array) -> jax.Array:
  """[..., S] bool: the positions holding a routing record, every real token but the last
  of its row (whose successor is real too). NumPy in, NumPy out; jax in, jax out."""
  xp = np if isinstance(input_mask_BS, np.ndarray) else jnp
  nxt = xp.concatenate([input_mask_BS[..., 1:] > 0,
                        xp.zeros_like(input_mask_BS[..., :1], dtype=bool)], axis=-1)
  return (input_mask_BS > 0) & nxt


def rl_batch_spec(num_prompts: int, group_size: int, seq_len: int,
                  routing: tuple[int, int, Any] | None = None) -> TrainBatch:
  """The shapes and dtypes of a `pack_rl` batch, as `jax.ShapeDtypeStruct`s (no memory);
  for compiling the train step ahead of time (`jaxrl-scale plan`). `routing`: (sparse
  layers L, top-K, dtype) of the routing records an MoE sampler sends along, or None."""
  pgs, pg = (num_prompts, group_size, seq_len), (num_prompts, group_size)
  s = jax.ShapeDtypeStruct
  records = None if routing is None else s(pgs + tuple(routing[:2]), routing[2])
  return TrainBatch(tokens_PGS=s(pgs, np.int32), positions_PGS=s(pgs, np.int32),
                    input_mask_PGS=s(pgs, np.int32), loss_mask_PGS=s(pgs, np.float32),
                    gen_logp_PGS=s(pgs, np.float32), advantages_PG=s(pg, np.float32),
                    weight_PG=s(pg, np.float32), prompt_id_PG=s(pg, np.int32),
                    routing_PGSLK=records)


def sft_batch_spec(batch_size: int, seq_len: int) -> SFTBatch:
  """The shapes and dtypes of a `pack_sft` batch, as `jax.ShapeDtypeStruct`s."""
  bs = (batch_size, seq_len)
  s = jax.ShapeDtypeStruct
  return SFTBatch(tokens_BS=s(bs, np.int32), positions_BS=s(bs, np.int32),
                  input_mask_BS=s(bs, np.int32), loss_mask_BS=s(bs, np.float32))


def _fill_row(seq_len: int, prompt: Sequence[int], completion: Sequence[int],
              pad_id: int) -> tuple[np.ndarray, np.ndarray, int, int]:
  lp, lc = len(prompt), len(completion)
  if lp == 0:
    raise ValueError("a sequence needs at least one prompt token (the first token is "
                     "never a target)")
  if lp + lc > seq_len:
    raise ValueError(f"prompt ({lp}) + completion ({lc}) tokens exceed seq_len={seq_len}")
  tokens = np.full((seq_len,), pad_id, np.int32)
  tokens[:lp] = prompt
  tokens[lp:lp + lc] = completion
  input_mask = np.zeros((seq_len,), np.int32)
  input_mask[:lp + lc] = 1
  return tokens, input_mask, lp, lc


def pack_rl(prompts: Sequence[Sequence[int]],
            completions: Sequence[Sequence[Sequence[int]]],
            gen_logprobs: Sequence[Sequence[Sequence[float]]],
            advantages: np.ndarray,
            *,
            seq_len: int,
            pad_id: int = 0,
            trainable: Sequence[Sequence[Sequence[bool]]] | None = None,
            weights: np.ndarray | None = None,
            prompt_ids: Sequence[int] | None = None,
            num_prompts: int | None = None,
            routing: Sequence[Sequence[np.ndarray]] | None = None) -> TrainBatch:
  """Packs ragged rollouts into a fixed-shape `TrainBatch` (NumPy, host side).

  Args:
    prompts: P prompt token lists.
    completions: [P][G] completion token lists.
    gen_logprobs: [P][G] per-token generator log-probs, same lengths as `completions`.
    advantages: [P, G] advantages.
    seq_len: S; prompt + completion must fit.
    pad_id: token written on padding positions.
    trainable: [P][G] per-completion-token flags (`Completion.trainable`), False on
      forced-interruption and environment tokens; None trains on every completion token.
    weights: [P, G] loss weights (0 drops a completion); None = all 1.
    prompt_ids: P dataset indices; None = 0..P-1.
    num_prompts: pad the prompt axis to this many with weight-0 rows, so every step has
      the same shape (and the jitted step compiles once).
    routing: [P][G] routing records (`Completion.routing`: [Lp - 1 + Lc, L, K] each, one
      dtype and L, K throughout), or None.

  Returns:
    A TrainBatch of NumPy arrays.
  """
  p_real = len(prompts)
  p = p_real if num_prompts is None else num_prompts
  if p < p_real:
    raise ValueError(f"{p_real} prompts do not fit num_prompts={p}")
  g = len(completions[0]) if p_real else 1
  advantages = np.asarray(advantages, np.float32).reshape(p_real, g)
  weights = (np.ones((p_real, g), np.float32) if weights is None
             else np.asarray(weights, np.float32).reshape(p_real, g))
  out = dict(
      tokens_PGS=np.full((p, g, seq_len), pad_id, np.int32),
      positions_PGS=np.tile(np.arange(seq_len, dtype=np.int32), (p, g, 1)),
      input_mask_PGS=np.zeros((p, g, seq_len), np.int32),
      loss_mask_PGS=np.zeros((p, g, seq_len), np.float32),
      gen_logp_PGS=np.zeros((p, g, seq_len), np.float32),
      advantages_PG=np.zeros((p, g), np.float32),
      weight_PG=np.zeros((p, g), np.float32),
      prompt_id_PG=np.full((p, g), -1, np.int32),
  )
  if routing is not None and p_real:
    first = np.asarray(routing[0][0])
    out["routing_PGSLK"] = np.zeros((p, g, seq_len) + first.shape[1:], first.dtype)
  for i in range(p_real):
    if len(completions[i]) != g:
      raise ValueError(f"prompt {i} has {len(completions[i])} completions, expected {g}")
    pid = i if prompt_ids is None else prompt_ids[i]
    for j in range(g):
      comp = completions[i][j]
      tokens, input_mask, lp, lc = _fill_row(seq_len, prompts[i], comp, pad_id)
      logp = np.asarray(gen_logprobs[i][j], np.float32)
      if logp.shape != (lc,):
        raise ValueError(f"gen_logprobs[{i}][{j}] has shape {logp.shape}, expected ({lc},)")
      train = (np.ones((lc,), bool) if trainable is None
               else np.asarray(trainable[i][j], bool).reshape(lc))
      finite = np.isfinite(logp)
      out["tokens_PGS"][i, j] = tokens
      out["input_mask_PGS"][i, j] = input_mask
      out["loss_mask_PGS"][i, j, lp:lp + lc] = train & finite
      out["gen_logp_PGS"][i, j, lp:lp + lc] = np.where(finite, logp, 0.0)
      out["advantages_PG"][i, j] = advantages[i, j]
      out["weight_PG"][i, j] = weights[i, j]
      out["prompt_id_PG"][i, j] = pid
      if "routing_PGSLK" in out:
        rec = routing[i][j]
        if rec is None or rec.shape[0] != lp + lc - 1:
          raise ValueError(f"routing[{i}][{j}] covers "
                           f"{'no' if rec is None else rec.shape[0]} positions, expected "
                           f"{lp + lc - 1} (prompt + completion - 1)")
        out["routing_PGSLK"][i, j, :lp + lc - 1] = rec
  return TrainBatch(**out)


def pack_sft(prompts: Sequence[Sequence[int]], solutions: Sequence[Sequence[int]], *,
             seq_len: int, pad_id: int = 0, batch_size: int | None = None) -> SFTBatch:
  """Packs (prompt, solution) pairs into an `SFTBatch`; rows past len(prompts) up to
  `batch_size` are padding (no loss)."""
  n = len(prompts)
  b = n if batch_size is None else batch_size
  if b < n:
    raise ValueError(f"{n} examples do not fit batch_size={b}")
  out = dict(
      tokens_BS=np.full((b, seq_len), pad_id, np.int32),
      positions_BS=np.tile(np.arange(seq_len, dtype=np.int32), (b, 1)),
      input_mask_BS=np.zeros((b, seq_len), np.int32),
      loss_mask_BS=np.zeros((b, seq_len), np.float32),
  )
  for i in range(n):
    tokens, input_mask, lp, lc = _fill_row(seq_len, prompts[i], solutions[i], pad_id)
    out["tokens_BS"][i] = tokens
    out["input_mask_BS"][i] = input_mask
    out["loss_mask_BS"][i, lp:lp + lc] = 1.0
  return SFTBatch(**out)
