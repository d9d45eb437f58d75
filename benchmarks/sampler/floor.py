"""The weight-matmul floor of a decode (sampler_bench.py's part 3, and the floor that
benchmarks/peers times beside the peers): `floor_program` and its tokens/s, `matmul_floor`."""

from __future__ import annotations

import time

import numpy as np


def floor_program(model_cfg, batch: int, dtype: str, steps: int = 32, prompt_len: int = 0):
  """(jitted program, its arguments): a decode step's weight matmuls alone, at `batch` rows.

  A jitted loop of `steps` steps. Each step runs every layer's q, k, v, o, gate, up and down
  projections and then the LM head, on weights of the model's shapes and dtype, one array
  per matrix (as the CPU and GPU samplers hold them). It does no attention, no sampling and no
  cache writes. Between the matmuls it does only the cheap elementwise work that chains
  them (a residual add, silu, an RMS scale, the logits' max), so no matmul can be dropped
  or hoisted out of the loop.

  An MoE model's sparse layer is its router [D, E] and one SwiGLU as wide as the top-k
  experts together (k * moe_intermediate_size, plus a shared expert): a token's active
  FLOPs, on the weights of only k experts, so the bound is an optimistic one (the real
  decode's rows go to different experts and read more of them).

  Its tokens/s (`matmul_floor`) bound any decode that uses these matmul kernels: it reads
  the same weights per step as the real decode, from the same memory hierarchy.

  `prompt_len` > 0: before the loop, the prefill's matmuls too: `batch` prompts of
  `prompt_len` tokens ([batch * prompt_len, D]) through every layer's projections, then the
  LM head on one row per prompt (a whole sampling call's weight matmuls, as
  benchmarks/peers times it against the peers' calls).
  """
  import jax
  import jax.numpy as jnp

  c = model_cfg
  d, v = c.hidden_size, c.vocab_size
  nh, kh = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  layer_shapes = []
  for sparse in c.moe_layers():
    f = (c.experts_per_token * c.moe_intermediate_size + c.shared_expert_size if sparse
         else c.intermediate_size)
    router = [(d, c.num_experts)] if sparse else []
    layer_shapes.append([(d, nh), (d, kh), (d, kh), (nh, d), (d, f), (d, f), (f, d)] + router)
  key = jax.random.key(0)
  shapes = [shape for layer in layer_shapes for shape in layer]
  weights = [jax.random.normal(jax.random.fold_in(key, i), s, dtype) / float(np.sqrt(s[0]))
             for i, s in enumerate(shapes)]
  head = jax.random.normal(jax.random.fold_in(key, 10_000), (v, d) if c.tie_embeddings else (d, v),
                           dtype) / float(np.sqrt(d))
  x0 = jax.random.normal(jax.random.fold_in(key, 10_001), (batch, d), dtype)
  group = c.num_heads // c.num_kv_heads

  def layers(weights, x):
    rows = x.shape[0]
    i = 0
    for layer in layer_shapes:
      wq, wk, wv, wo, wg, wu, wd, *router = weights[i:i + len(layer)]
      i += len(layer)
      kv = (x @ wk + x @ wv).reshape(rows, c.num_kv_heads, 1, c.head_dim)
      a = x @ wq + jnp.broadcast_to(kv, (rows, c.num_kv_heads, group, c.head_dim)).reshape(
          rows, nh)
      x = x + a @ wo
      if router:  # the router's scores scale the experts' input, so it stays in the loop
        x = x * (1 + 1e-3 * jnp.max(x @ router[0], axis=-1, keepdims=True))
      x = x + (jax.nn.silu(x @ wg) * (x @ wu)) @ wd
      x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)
    return x

  def with_head(head, x):
    spec = (((1,), (1,)), ((), ())) if c.tie_embeddings else (((1,), (0,)), ((), ()))
    logits = jax.lax.dot_general(x, head, spec, preferred_element_type=jnp.float32)
    return x + 1e-3 * jnp.max(logits, axis=-1, keepdims=True).astype(x.dtype)

  def step(weights, head, x):
    return with_head(head, layers(weights, x))

  def run(x, weights, head, *prompt):
    if prompt:  # each prompt's rows after the layers, averaged (so that every row stays
      # live: the layers mix no rows, so XLA could cut a slice up through them) and through
      # the head, start the loop
      out = layers(weights, prompt[0]).reshape(batch, prompt_len, d).mean(axis=1)
      x = x + 1e-3 * with_head(head, out)
    return jax.lax.fori_loop(0, steps, lambda _, x: step(weights, head, x), x)

  prompt = ([jax.random.normal(jax.random.fold_in(key, 10_002), (batch * prompt_len, d), dtype)]
            if prompt_len else [])
  return jax.jit(run), (x0, weights, head, *prompt)


def matmul_floor(model_cfg, batch: int, dtype: str, steps: int = 32, repeats: int = 3) -> float:
  """Tokens/s of `floor_program` (see there), the best of `repeats` runs."""
  run, args = floor_program(model_cfg, batch, dtype, steps)
  run(*args).block_until_ready()  # compile
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    run(*args).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return batch * steps / best
