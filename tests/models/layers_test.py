"""layers.Einsum: the projections' dot_general against numpy's einsum, and its kernel layout."""

import re

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


@pytest.mark.parametrize("spec,shape,x_shape", _CASES)
def test_flat_projections_keep_the_sums_and_gradients(spec, shape, x_shape):
  """Under `flat_projections` (the CPU trainer's), a projection whose contraction is the
  input's trailing axes into the kernel's leading ones runs as one 2-D matmul; its value
  and both gradients are numpy's einsums of the spec (the hand-written chain rule), and a
  permuted output keeps the 3-D dot_general."""
  mod = layers.Einsum(spec, shape, (None,) * len(shape), rngs=nnx.Rngs(0),
                      param_dtype=jnp.float32, dtype=jnp.float32)
  graphdef, state = nnx.split(mod)
  rng = np.random.default_rng(2)
  x = rng.standard_normal(x_shape).astype(np.float32)
  kernel = np.asarray(mod.kernel[...], np.float64)
  want = np.einsum(spec, x.astype(np.float64), kernel)
  g = rng.standard_normal(want.shape).astype(np.float32)

  def loss(state, x):
    with layers.flat_projections():
      return jnp.sum(nnx.merge(graphdef, state)(x) * g)

  (lhs, rhs), out = spec.split("->")[0].split(","), spec.split("->")[1]
  with layers.flat_projections():
    got = np.asarray(nnx.merge(graphdef, state)(jnp.asarray(x)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  d_state, d_x = jax.grad(loss, argnums=(0, 1))(state, jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(d_x), np.einsum(f"{out},{rhs}->{lhs}", g, kernel),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(d_state["kernel"][...]),
                             np.einsum(f"{lhs},{out}->{rhs}", x, g), rtol=1e-5, atol=1e-4)
  ranks = _dot_ranks(jax.jit(jax.grad(loss)).lower(state, jnp.asarray(x)).as_text())
  flat = spec.split("->")[1] != "BTHN"
  assert ranks and (max(ranks) == 2) == flat, ranks


def _dot_ranks(hlo: str) -> list[int]:
  """The lhs rank of every dot_general in StableHLO text `hlo`."""
  return [len(m.group(1).split("x")) - 1 for m in re.finditer(
      r"stablehlo\.dot_general[^\n]*?: \(tensor<([0-9x]+)[a-z0-9]+>", hlo)]


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


def _head_inputs(dtype, seed=0, b=3, t=5, d=256, v=96):
  """h [B, T, D] in `dtype`; the trainer's float32 master of a `dtype` head, [V, D] (tied
  spec) rounded as `Transformer.head` gives it (`held`)."""
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.standard_normal((b, t, d)) * 3, dtype)
  master = jnp.asarray(rng.standard_normal((v, d)) * 0.05, jnp.float32)
  return h, master, layers.held(master, dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_fp32_logits_of_16bit_operands_are_the_float32_matmul(dtype):
  """The 16-bit forward (products exact in float32, float32 sums) against float64 NumPy of
  the same values and the float32 HIGHEST matmul it replaces: equal up to float32 rounding
  of a 256-term sum; the generator's 16-bit copy of the weights gives the same logits as
  the trainer's rounded master."""
  h, _, w = _head_inputs(dtype)
  got = layers.fp32_logits(h, w, "BTD,VD->BTV", dtype)
  assert got.dtype == jnp.float32
  ref64 = np.einsum("btd,vd->btv", np.asarray(h, np.float64), np.asarray(w, np.float64))
  scale = np.abs(ref64).max()
  np.testing.assert_allclose(np.asarray(got), ref64, atol=2e-6 * scale, rtol=0)
  old = layers._fp32_einsum("BTD,VD->BTV", h, w)
  np.testing.assert_allclose(np.asarray(got), np.asarray(old), atol=2e-6 * scale, rtol=0)
  sampler = layers.fp32_logits(h, w.astype(dtype), "BTD,VD->BTV", dtype)
  np.testing.assert_array_equal(np.asarray(sampler), np.asarray(got))
  # The same sum in bfloat16 (what a 16-bit head returns) is off by far more.
  low = jnp.einsum("BTD,VD->BTV", h, w.astype(dtype)).astype(jnp.float32)
  assert np.abs(np.asarray(low) - ref64).max() > 100 * 2e-6 * scale


def test_bf16_pieces_sum_back_exactly():
  rng = np.random.default_rng(3)
  x = (rng.standard_normal(4096) * np.exp(rng.uniform(-60, 60, 4096))).astype(np.float32)
  pieces = layers.bf16_pieces(jnp.asarray(x))
  assert pieces.shape == (3, 4096) and pieces.dtype == jnp.bfloat16
  p = np.asarray(pieces, np.float32)
  np.testing.assert_array_equal(p[0] + p[1] + p[2], x)
  assert (np.abs(p[1]) <= np.abs(p[0]) * 2.0 ** -8).all()  # each piece below the last's ulp
  assert (np.abs(p[2]) <= np.abs(p[1]) * 2.0 ** -8).all()


def test_bf16_rounding_is_an_op_the_compiler_keeps():
  """bf16_pieces and held round float32 to bfloat16 values with reduce_precision: a plain
  float32 -> bfloat16 -> float32 round trip is a pair XLA may drop as a no-op (XLA:GPU's
  simplify-fp-conversions with excess precision allowed, its default), which would zero
  the lower pieces and let the trainer read its unrounded masters. (No GPU compiler here:
  this checks the program asks for the kept op, and that it rounds as the cast does.)"""
  x = jnp.asarray(np.random.default_rng(5).standard_normal(1000) * 10, jnp.float32)
  for fn in (layers.bf16_pieces, lambda w: layers.held(w, jnp.bfloat16)):
    inner = str(jax.make_jaxpr(fn)(x))
    assert "reduce_precision" in inner, inner
  np.testing.assert_array_equal(np.asarray(layers.held(x, jnp.bfloat16)),
                                np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32)))


def _dots(fn, *args):
  """(operand dtypes, precision) of every dot_general in fn's jaxpr, inner jaxprs (custom
  VJPs', transposes') included."""
  out = []

  def walk(jaxpr):
    for e in jaxpr.eqns:
      if e.primitive.name == "dot_general":
        out.append((tuple(str(x.aval.dtype) for x in e.invars), str(e.params["precision"])))
      for value in e.params.values():
        inner = getattr(value, "jaxpr", value)
        if hasattr(inner, "eqns"):
          walk(inner)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return out


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_fp32_logits_gradients_are_the_float32_matmuls(dtype):
  """Through the trainer's float32 master: dh and dw against float64 NumPy. bfloat16's
  backward runs as bf16 matmuls over bf16 pieces of the float32 cotangent: dw over the two
  largest, within the dropped piece's 2^-16 of its terms; dh over the largest alone, the
  bf16 cotangent every layer below gets, within bf16's rounding of its terms. float16's as
  the float32 matmul; float32 activations keep the float32 matmul both ways."""
  h, master, _ = _head_inputs(dtype, seed=1)
  r = np.random.default_rng(2).standard_normal((3, 5, 96)) * np.exp(
      np.random.default_rng(4).uniform(-8, 0, (3, 5, 96)))  # cotangents of many sizes
  r = jnp.asarray(r, jnp.float32)

  def grads(head):
    loss = lambda h, m: jnp.sum(head(h, layers.held(m, dtype)) * r)
    return jax.jit(jax.grad(loss, argnums=(0, 1)))(h, master)

  new = lambda h, w: layers.fp32_logits(h, w, "BTD,VD->BTV", dtype)
  old = lambda h, w: layers._fp32_einsum("BTD,VD->BTV", h, w)
  g_new, g_old = grads(new), grads(old)
  assert g_new[0].dtype == dtype and g_new[1].dtype == jnp.float32
  r64, w64 = np.asarray(r, np.float64), np.asarray(layers.held(master, dtype), np.float64)
  dh64 = np.einsum("btv,vd->btd", r64, w64)
  dw64 = np.einsum("btd,btv->vd", np.asarray(h, np.float64), r64)
  got = np.asarray(g_new[0], np.float64)
  if dtype == jnp.bfloat16:
    # dh from the cotangent's largest piece: each term's cotangent rounded to bf16 (2^-8
    # of it at most), the float32 sum, then dh rounded to bf16 (2^-8 of dh).
    terms = np.einsum("btv,vd->btd", np.abs(r64), np.abs(w64))
    assert np.all(np.abs(got - dh64) <= 2.0 ** -8 * (np.abs(dh64) + terms * (1 + 2.0 ** -7)))
    # In norm, within 1.6x of the correctly rounded bf16 dh's own error (the float32
    # matmul's dh, the old head's, is that value); the bf16 cotangent's dh exactly.
    rounded = np.asarray(jnp.asarray(dh64, jnp.bfloat16), np.float64)
    np.testing.assert_array_equal(np.asarray(g_old[0], np.float64), rounded)
    norm_err = lambda x: np.linalg.norm(x - dh64) / np.linalg.norm(dh64)
    assert norm_err(got) <= 1.6 * norm_err(rounded), (norm_err(got), norm_err(rounded))
    bf16_dh = np.einsum("btv,vd->btd", np.asarray(jnp.asarray(r, jnp.bfloat16), np.float64),
                        w64)
    np.testing.assert_array_equal(got, np.asarray(jnp.asarray(bf16_dh, jnp.bfloat16),
                                                  np.float64))
  else:
    # float16's: the float32 matmul, as close as the old head's.
    err = np.abs(got - dh64).max()
    old_err = np.abs(np.asarray(g_old[0], np.float64) - dh64).max()
    assert err <= 2 * old_err + 1e-7 * np.abs(dh64).max(), (err, old_err)
  dw_terms = np.einsum("btd,btv->vd", np.abs(np.asarray(h, np.float64)), np.abs(r64))
  dw_err = np.abs(np.asarray(g_new[1], np.float64) - dw64)
  if dtype == jnp.bfloat16:
    # dw is float32 from the two largest pieces: off the exact sum by at most the third
    # piece's share (2^-16 of the terms' magnitudes) plus float32's own rounding.
    assert np.all(dw_err <= (2.0 ** -16 + 2.0 ** -20) * dw_terms), (
        (dw_err / dw_terms).max())
    # ... and 100x closer than the bf16 cotangent the other weight gradients get.
    bf16_dw = np.einsum("btd,btv->vd", np.asarray(h, np.float64),
                        np.asarray(jnp.asarray(r, jnp.bfloat16), np.float64))
    assert np.linalg.norm(dw_err) * 100 <= np.linalg.norm(bf16_dw - dw64)
  else:
    np.testing.assert_allclose(np.asarray(g_new[1], np.float64), dw64,
                               atol=1e-6 * np.abs(dw64).max(), rtol=0)

  bf16_w = layers.held(master, dtype)
  dt = np.dtype(dtype).name
  assert _dots(new, h, bf16_w) == [((dt, dt), "None")]
  backward = _dots(jax.grad(lambda h, w: jnp.sum(new(h, w) * r), argnums=(0, 1)), h, bf16_w)
  if dtype == jnp.bfloat16:
    assert {d for d, _ in backward} == {("bfloat16", "bfloat16")}
    assert len(backward) == 4  # the forward; dh over one piece, dw over two
  else:
    assert ("float32", "float32") in {d for d, _ in backward}
  h32 = h.astype(jnp.float32)
  wide = lambda h, w: layers.fp32_logits(h, w, "BTD,VD->BTV", jnp.float32)
  assert [d for d, _ in _dots(wide, h32, master)] == [("float32", "float32")]
  assert "HIGHEST" in _dots(wide, h32, master)[0][1]


def _silu64(x):
  return x / (1 + np.exp(-x))


@pytest.mark.parametrize("stack", [False, True])
def test_mlp_is_swiglu_with_gate_and_up_stacked_or_not(stack):
  """SwiGLU against float64 NumPy (bf16 compute: within bf16 rounding), value and input
  gradient, both ways. Stacked, gate and up are one matmul of their kernels side by side,
  so the gradient holds 6 matmuls (gate-up, down; down's two transposes; gate-up's two),
  not 9. (Which way runs where: `test_mlp_stacks_gate_and_up_on_gpus_over_many_tokens`.)"""
  t = 40
  from jaxrl_scale.models import config  # pylint: disable=g-import-not-at-top
  cfg = config.tiny_qwen3()
  cfg = type(cfg)(**{**cfg.__dict__, "dtype": "bfloat16", "param_dtype": "bfloat16"})
  mlp = layers.MLP(cfg, rngs=nnx.Rngs(3))
  graphdef, state = nnx.split(mlp)
  x = jnp.asarray(np.random.default_rng(5).normal(size=(2, t, cfg.hidden_size)), jnp.bfloat16)
  r = jnp.asarray(np.random.default_rng(6).normal(size=(2, t, cfg.hidden_size)), jnp.float32)
  f = lambda st, x_: jnp.sum(  # noqa: E731
      nnx.merge(graphdef, st)(x_, stack=stack).astype(jnp.float32) * r)

  k = {n: np.asarray(getattr(mlp, n).kernel[...], np.float64)
       for n in ("gate_proj", "up_proj", "down_proj")}
  x64, r64 = np.asarray(x, np.float64), np.asarray(r, np.float64)
  a, b = x64 @ k["gate_proj"], x64 @ k["up_proj"]
  want = (_silu64(a) * b) @ k["down_proj"]
  got = np.asarray(nnx.merge(graphdef, state)(x, stack=stack), np.float64)
  np.testing.assert_allclose(got, want, atol=0.03 * np.abs(want).max(), rtol=0.02)
  # d/dx: dy = r W_down^T; da = dy * b * silu'(a); db = dy * silu(a).
  dy = r64 @ k["down_proj"].T
  sig = 1 / (1 + np.exp(-a))
  dx = (dy * b * sig * (1 + a * (1 - sig))) @ k["gate_proj"].T + (dy * _silu64(a)) @ k[
      "up_proj"].T
  got_dx = np.asarray(jax.grad(f, argnums=1)(state, x), np.float64)
  np.testing.assert_allclose(got_dx, dx, atol=0.03 * np.abs(dx).max(), rtol=0.02)

  assert len(_dots(jax.grad(f, argnums=(0, 1)), state, x)) == (6 if stack else 9)


def test_stacked_swiglu_value_and_gradient():
  """`stacked_swiglu`: the forward is jax's silu(gate) * up to the bit; its written-out
  backward is the derivative: float32 against float64 NumPy to float32 rounding and against
  autodiff of the unstacked form; bfloat16 rounded once from float32, so at least as close
  to float64 as autodiff's bfloat16 chain (the form it replaced)."""
  rng = np.random.default_rng(0)
  gu = rng.normal(size=(3, 5, 2, 16)) * 3
  dh = rng.normal(size=(3, 5, 16))
  g64, u64 = gu[..., 0, :], gu[..., 1, :]
  sig = 1 / (1 + np.exp(-g64))
  want = np.stack([dh * u64 * sig * (1 + g64 * (1 - sig)), dh * _silu64(g64)], axis=-2)
  plain = lambda x: jax.nn.silu(x[..., 0, :]) * x[..., 1, :]  # noqa: E731
  for dtype in (jnp.float32, jnp.bfloat16):
    x, d = jnp.asarray(gu, dtype), jnp.asarray(dh, dtype)
    out, vjp = jax.vjp(layers.stacked_swiglu, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain(x)))
    (got,) = vjp(d)
    assert got.dtype == dtype
    err = np.abs(np.asarray(got, np.float64) - want).max()
    (auto,) = jax.vjp(plain, x)[1](d)
    if dtype == jnp.float32:
      assert err < 1e-5 * np.abs(want).max()
      np.testing.assert_allclose(np.asarray(got), np.asarray(auto), rtol=2e-6, atol=1e-6)
    else:
      assert err <= np.abs(np.asarray(auto, np.float64) - want).max()


def test_the_stacked_swiglu_backward_pads_nothing_compiled_for_an_h100():
  """Compiled for an H100 (no GPU), the stacked MLP's gradient holds no pad: autodiff's
  form (each half's cotangent padded to [..., 2, F], then summed) became one elementwise
  pass that XLA:GPU emitted with 28 scalar 2-byte loads a thread (the PTX of the
  qwen3_1p7b train step), where `stacked_swiglu`'s backward loads vectors."""
  from jaxrl_scale.models import config  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.plan import chips  # pylint: disable=g-import-not-at-top
  cfg = config.tiny_qwen3()
  cfg = type(cfg)(**{**cfg.__dict__, "dtype": "bfloat16", "param_dtype": "bfloat16"})
  mlp = layers.MLP(cfg, rngs=nnx.Rngs(3))
  graphdef, state = nnx.split(mlp)
  try:
    gpu = chips.topology_devices(chips.resolve("h100-2"))
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"no deviceless CUDA topology here: {e}")
  mesh = jax.sharding.Mesh(np.array(gpu[:1]), ("fsdp",))
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  x = jax.ShapeDtypeStruct((2, 40, cfg.hidden_size), jnp.bfloat16, sharding=rep)
  spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), state)

  def loss(st, x_):
    return jnp.sum(nnx.merge(graphdef, st)(x_, rep, stack=True).astype(jnp.float32))

  with jax.set_mesh(mesh):
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(spec, x).compile().as_text()
  assert " dot(" in text or "gemm" in text  # compiled for real
  # (XLA pads some matmul operands to its tiles; none of the [B, T, 2, F] cotangent.)
  f = cfg.intermediate_size
  assert not re.search(rf"= \w+\[2,40,(2|1),{f}\]\S* pad\(", text)


def test_mlp_stacks_gate_and_up_on_gpus_over_many_tokens():
  """By default the kernels are stacked only on GPUs (compiled here for an H100 with no GPU)
  and only over more tokens than the hidden size (64): not in decode, not on CPU or TPU."""
  from jaxrl_scale.models import config  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.plan import chips  # pylint: disable=g-import-not-at-top
  cfg = config.tiny_qwen3()
  mlp = layers.MLP(cfg, rngs=nnx.Rngs(3))
  graphdef, state = nnx.split(mlp)

  def stacks(t: int, sharding) -> bool:  # two matmuls (gate-up, down), not three
    x = jax.ShapeDtypeStruct((2, t, cfg.hidden_size), jnp.float32)
    return len(_dots(lambda st, x_: nnx.merge(graphdef, st)(x_, sharding), state, x)) == 2

  assert not stacks(40, None)  # CPU
  try:
    gpu = chips.topology_devices(chips.resolve("h100-2"))
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f"no deviceless CUDA topology here: {e}")
  mesh = jax.sharding.Mesh(np.array(gpu[:1]), ("fsdp",))
  on_gpu = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  assert stacks(40, on_gpu) and not stacks(1, on_gpu)
