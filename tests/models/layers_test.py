"""layers.Einsum: the projections' dot_general against numpy's einsum, and its kernel layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.models import layers

# (spec, kernel shape, input shape): every projection the model builds, plus an output order
# that dot_general does not produce by itself.
_CASES = [
    ("BTD,DNH->BTNH", (16, 4, 8), (3, 5, 16)),  # q/k/v_proj
    ("BTNH,NHD->BTD", (4, 8, 16), (3, 5, 4, 8)),  # o_proj
    ("BTD,DF->BTF", (16, 24), (3, 5, 16)),  # MLP
    ("BTD,DNH->BTHN", (16, 4, 8), (3, 5, 16)),  # permuted output
]


@pytest.mark.parametrize("spec,shape,x_shape", _CASES)
def test_einsum_matches_numpy(spec, shape, x_shape):
  mod = layers.Einsum(spec, shape, (None,) * len(shape), rngs=nnx.Rngs(0),
                      param_dtype=jnp.float32, dtype=jnp.float32)
  x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
  want = np.einsum(spec, x.astype(np.float64), np.asarray(mod.kernel[...], np.float64))
  got = np.asarray(mod(jnp.asarray(x)))
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_einsum_with_batch_axes_is_refused():
  with pytest.raises(ValueError, match="batch axes"):
    layers.Einsum("BTD,BDF->BTF", (2, 16, 24), (None,) * 3, rngs=nnx.Rngs(0),
                  param_dtype=jnp.float32, dtype=jnp.float32)


def test_o_proj_does_not_transpose_its_kernel():
  """jnp.einsum contracted "BTNH,NHD" over (H, N), and XLA:CPU copied the kernel into that
  order on every call (a decode step paid it once per layer)."""
  mod = layers.Einsum("BTNH,NHD->BTD", (8, 64, 512), (None,) * 3, rngs=nnx.Rngs(0),
                      param_dtype=jnp.float32, dtype=jnp.float32)
  graphdef, state = nnx.split(mod)

  def call(state, x):
    return nnx.merge(graphdef, state)(x)

  x = jax.ShapeDtypeStruct((32, 1, 8, 64), jnp.float32)
  hlo = jax.jit(call).lower(state, x).compile().as_text()
  assert "transpose(" not in hlo


# --------------------------------------------------------------------------------------
# layers.held: a wider array (the trainer's float32 master) computes as its param_dtype copy.


def test_held_rounds_like_the_generators_copy_and_passes_gradients_unrounded():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((64,)).astype(np.float32))
  copy = w.astype(jnp.bfloat16)  # what parallel.transfer gives the generator
  assert not np.array_equal(np.asarray(w), np.asarray(copy, np.float32))  # it does round
  np.testing.assert_array_equal(np.asarray(layers.held(w, jnp.bfloat16)),
                                np.asarray(copy, np.float32))
  # A float32 cotangent reaches the master as it is, not rounded to bf16: updates below a
  # bf16 spacing still accumulate in the master.
  c = jnp.asarray(rng.standard_normal((64,)).astype(np.float32) * 1e-3 + 1.0)
  grad = jax.grad(lambda w: jnp.sum(layers.held(w, jnp.bfloat16) * c))(w)
  np.testing.assert_array_equal(np.asarray(grad), np.asarray(c))
  assert not np.array_equal(np.asarray(c), np.asarray(c.astype(jnp.bfloat16), np.float32))
  # Already in param_dtype (the generator) or not a float: untouched.
  assert layers.held(copy, jnp.bfloat16) is copy
  ids = jnp.arange(3)
  assert layers.held(ids, jnp.bfloat16) is ids


def test_einsum_and_norm_compute_with_the_param_dtype_weights():
  mod = layers.Einsum("BTD,DF->BTF", (16, 24), (None, None), rngs=nnx.Rngs(0),
                      param_dtype=jnp.bfloat16, dtype=jnp.float32)
  norm = layers.RMSNorm(16, 1e-6, jnp.bfloat16)
  rng = np.random.default_rng(2)
  master = rng.standard_normal((16, 24)).astype(np.float32)
  scale = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
  x = jnp.asarray(rng.standard_normal((2, 3, 16)).astype(np.float32))

  def run(kernel, norm_scale):
    mod.kernel.set_value(jnp.asarray(kernel))
    norm.scale.set_value(jnp.asarray(norm_scale))
    return np.asarray(mod(norm(x)))

  as_master = run(master, scale)  # the trainer's float32 arrays of a bf16 model
  as_copy = run(master.astype(jnp.bfloat16), scale.astype(jnp.bfloat16))  # the generator's
  np.testing.assert_array_equal(as_master, as_copy)
