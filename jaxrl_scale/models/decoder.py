"""The decoder block: attention then a dense MLP, a mixture of experts, or both by layer.

Its own module because it joins `models.layers` (norms, attention, the dense MLP) and
`models.moe` (whose experts are built from `layers`' params): layers.py imports neither
this module nor moe.py, so the three import without a circle. `models.transformer` stacks
one DecoderLayer over the layers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_scale.models import layers, moe
from jaxrl_scale.models.config import ModelConfig


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)).

  The MLP is dense (`mlp`), a mixture of experts (`moe`), or, in a model that interleaves
  the two (cfg.moe_layers() mixed), both, the layer's index choosing which runs: the layers
  are one stacked module, so every layer holds the same params (the unused set is zeros
  after a Hugging Face load and gets no gradient).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    self.input_layernorm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd)
    self.self_attn = layers.Attention(cfg, rngs=rngs)
    self.post_attention_layernorm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd)
    sparse = cfg.moe_layers()
    self.mlp = layers.MLP(cfg, rngs=rngs) if not all(sparse) else None
    self.moe = moe.MoE(cfg, rngs=rngs) if any(sparse) else None
    self.sparse = sparse if self.mlp is not None and self.moe is not None else None
    self.num_experts = cfg.num_experts

  def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array, attend: layers.Attend,
               layer: jax.Array | int = 0, mask_BT: jax.Array | None = None,
               sharding: jax.sharding.NamedSharding | None = None,
               recorded_BTK: jax.Array | None = None, recorded_BT: jax.Array | None = None,
               replay: bool = False,
               ) -> tuple[jax.Array, Any, moe.RouterStats | None, jax.Array | None]:
    """(x_BTD after the block, the aux output of `attend`, the router stats of a sparse
    layer or zeros, the experts_BTK int32 its tokens went to or zeros (both None in a dense
    model)); see `layers.Attention.__call__`.

    Args:
      layer: this layer's index (chooses dense or sparse in an interleaved model).
      mask_BT: True at real tokens, which the router stats count (None: all).
      sharding: where the [B, T, D] activations live (`moe.MoE.apply`).
      recorded_BTK, recorded_BT, replay: routing replay (`moe.MoE.apply`); ignored by a
        dense layer.
    """
    attn_BTD, aux = self.self_attn(self.input_layernorm(x_BTD), positions_BT, attend)
    x_BTD = layers.residual(x_BTD, attn_BTD)
    h_BTD = self.post_attention_layernorm(x_BTD)
    if self.moe is None:
      return layers.residual(x_BTD, self.mlp(h_BTD, sharding)), aux, None, None
    sparse = lambda h: self.moe.apply(h, mask_BT, sharding, recorded_BTK,  # noqa: E731
                                      recorded_BT, replay)
    if self.mlp is None:
      y_BTD, stats, experts_BTK = sparse(h_BTD)
    else:
      b, t, _ = h_BTD.shape
      dense = lambda h: (self.mlp(h, sharding),  # noqa: E731
                         moe.RouterStats.zeros(self.num_experts),
                         jnp.zeros((b, t, self.moe.top_k), jnp.int32))
      y_BTD, stats, experts_BTK = jax.lax.cond(jnp.asarray(self.sparse)[layer], sparse, dense,
                                               h_BTD)
    return layers.residual(x_BTD, y_BTD), aux, stats, experts_BTK
