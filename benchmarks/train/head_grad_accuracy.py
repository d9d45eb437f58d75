"""How exact the FP32 LM head's gradients are, against float64 NumPy.

    python benchmarks/train/head_grad_accuracy.py [--tokens 8192 --vocab 512 --hidden 64]

The head's backward (`layers.fp32_logits`) computes dw = h^T g from bf16 pieces of the
float32 cotangent g. This prints, for an RL-shaped cotangent (softmax minus one-hot,
scaled by advantages of both signs over a token-average normaliser) and bf16 activations,
the relative error in norm and the largest error per entry (over the sum of the terms'
magnitudes) of dw from three pieces, from two (what the head runs), from one (a bf16
cotangent, what every other weight gradient of a bf16 model gets) and of the float32 matmul
at HIGHEST precision, all on this machine's default backend. Then the same for dh = g w
(returned in bf16, the activations' dtype), from one piece (what the head runs) and two,
next to the correctly rounded bf16 of the exact dh (what the float32 matmul returns).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.models import layers


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tokens", type=int, default=8192)
  p.add_argument("--vocab", type=int, default=512)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  rng = np.random.default_rng(args.seed)
  t, v, d = args.tokens, args.vocab, args.hidden
  h = jnp.asarray(rng.standard_normal((t, d)), jnp.bfloat16)
  z = rng.standard_normal((t, v)) * 3
  prob = np.exp(z - z.max(1, keepdims=True))
  prob /= prob.sum(1, keepdims=True)
  onehot = np.zeros((t, v))
  onehot[np.arange(t), rng.integers(0, v, t)] = 1
  coef = rng.choice([-1, 1], t) * rng.uniform(0.5, 1.5, t) / t
  g = (coef[:, None] * (onehot - prob)).astype(np.float32)
  h64, g64 = np.asarray(h, np.float64), g.astype(np.float64)
  want = h64.T @ g64
  terms = np.abs(h64).T @ np.abs(g64)
  pieces = layers.bf16_pieces(jnp.asarray(g))

  def from_pieces(k: int) -> np.ndarray:
    out = [jnp.einsum("td,tv->dv", h, pieces[i], preferred_element_type=jnp.float32)
           for i in range(k)]
    total = out[-1]
    for x in out[-2::-1]:  # smallest first, as the head sums them
      total = total + x
    return np.asarray(total, np.float64)

  f32 = np.asarray(jnp.einsum("td,tv->dv", h.astype(jnp.float32), jnp.asarray(g),
                              precision=jax.lax.Precision.HIGHEST), np.float64)
  print(f"dw of {t} tokens x vocab {v} x hidden {d}, {jax.default_backend()}, "
        f"jax {jax.__version__}")
  for name, got in (("3 bf16 pieces", from_pieces(3)),
                    ("2 bf16 pieces (the head's)", from_pieces(2)),
                    ("1 piece (a bf16 cotangent)", from_pieces(1)),
                    ("float32 matmul, HIGHEST", f32)):
    err = got - want
    print(f"  {name:28s} relative error in norm {np.linalg.norm(err) / np.linalg.norm(want):.2e}"
          f", largest over its terms {np.max(np.abs(err) / terms):.2e}")

  w = jnp.asarray(rng.standard_normal((v, d)) * 0.05, jnp.bfloat16)
  w64 = np.asarray(w, np.float64)
  want_h = g64 @ w64
  to_bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16), np.float64)

  def dh_from(k: int) -> np.ndarray:
    out = [jnp.einsum("tv,vd->td", pieces[i], w, preferred_element_type=jnp.float32)
           for i in range(k)]
    total = out[-1]
    for x in out[-2::-1]:
      total = total + x
    return to_bf16(total)

  print(f"dh (bf16) of the same cotangent, a bf16 head of vocab {v} x hidden {d}")
  for name, got in (("exact, rounded to bf16", to_bf16(want_h)),
                    ("2 bf16 pieces", dh_from(2)),
                    ("1 piece (the head's)", dh_from(1))):
    err = got - want_h
    print(f"  {name:28s} relative error in norm "
          f"{np.linalg.norm(err) / np.linalg.norm(want_h):.2e}")


if __name__ == "__main__":
  main()
