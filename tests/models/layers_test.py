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
