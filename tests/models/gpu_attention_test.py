"""The GPU (cuDNN flash) attention path, checked on CPU through the same JAX call.

`attention.fused_attention` builds the arguments of `jax.nn.dot_product_attention` (causal,
key lengths, left padding shifted to the right) and takes the implementation string as an
argument: on a GPU it is "cudnn", here "xla". Everything else is the code the GPU runs, so
these tests compare it with `einsum_attention` (values and gradients) for every padding
layout our batches can hold. The platform choice is checked by faking a GPU platform; nothing
is compiled for a GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.models import attention


def random_qkv(b, t, n, k, h, dtype, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, n, h)).astype(np.float32)
  kk = rng.normal(size=(b, t, k, h)).astype(np.float32)
  v = rng.normal(size=(b, t, k, h)).astype(np.float32)
  return tuple(jnp.asarray(x, dtype) for x in (q, kk, v))


def row_masks(t, rows):
  """(start, length) per row -> [B, T] bool: `length` real tokens from `start`."""
  mask = np.zeros((len(rows), t), bool)
  for r, (start, length) in enumerate(rows):
    mask[r, start:start + length] = True
  return mask


T = 12
LAYOUTS = {
    # right padding only (what the trainer and prefill build), one row full, one length 1
    "right": [(0, 12), (0, 7), (0, 1), (0, 4)],
    # left padding only: the first queries of rows 1-3 see no key at all
    "left": [(0, 12), (5, 7), (11, 1), (8, 4)],
    # both, and an all-padding row (an unused row of a fixed-shape batch)
    "both": [(3, 6), (0, 12), (0, 0), (2, 9)],
}


def visible_BT(mask_BT):
  """Queries with a visible key; the rest are garbage by contract (never compared)."""
  return np.cumsum(mask_BT, axis=1) > 0


def out_and_grads(fn, q, k, v, mask, weight_BTNH):
  def loss(q, k, v):
    out = fn(q, k, v, mask)
    return jnp.sum((out.astype(jnp.float32) * weight_BTNH) ** 2), out

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("n,k", [(6, 2), (4, 4), (4, 1)])  # GQA, MHA, MQA
def test_fused_xla_matches_einsum_values_and_gradients(layout, n, k):
  q, kk, v = random_qkv(4, T, n, k, 8, jnp.float32, seed=hash(layout) % 100)
  mask = row_masks(T, LAYOUTS[layout])
  vis = visible_BT(mask)
  # A loss over the visible queries only, with distinct weights so that every output
  # element's gradient path counts.
  weight = np.random.default_rng(3).uniform(0.5, 1.5, q.shape).astype(np.float32)
  weight = jnp.asarray(weight * vis[:, :, None, None])
  fused = lambda q, k, v, m: attention.fused_attention(q, k, v, m, implementation="xla")
  g_fused, out_fused = out_and_grads(fused, q, kk, v, jnp.asarray(mask), weight)
  g_ref, out_ref = out_and_grads(attention.einsum_attention, q, kk, v, jnp.asarray(mask),
                                 weight)
  assert out_fused.shape == q.shape and out_fused.dtype == q.dtype
  assert np.isfinite(np.asarray(out_fused)).all()
  np.testing.assert_allclose(np.asarray(out_fused)[vis], np.asarray(out_ref)[vis],
                             atol=1e-5, rtol=1e-5)
  for name, a, b in zip("qkv", g_fused, g_ref):
    assert np.isfinite(np.asarray(a)).all(), name
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_fused_xla_matches_einsum_in_bfloat16():
  """The dtype the GPU path runs in (cuDNN takes bf16/fp16 only)."""
  q, k, v = random_qkv(3, T, 4, 2, 16, jnp.bfloat16, seed=7)
  mask = row_masks(T, [(2, 10), (0, 5), (4, 4)])
  out = attention.fused_attention(q, k, v, jnp.asarray(mask), implementation="xla")
  ref = attention.einsum_attention(q, k, v, jnp.asarray(mask))
  vis = visible_BT(mask)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32)[vis], np.asarray(ref, np.float32)[vis],
                             atol=2e-2, rtol=2e-2)


def test_left_shift_is_skipped_when_no_row_is_left_padded(monkeypatch):
  """Right-padded batches (every caller's) take the no-shift branch, left-padded ones the
  shift: the shift is what makes left padding right, so breaking it must break the result."""
  q, k, v = random_qkv(2, T, 4, 2, 8, jnp.float32, seed=5)
  left = jnp.asarray(row_masks(T, [(4, 8), (0, 12)]))
  right = jnp.asarray(row_masks(T, [(0, 8), (0, 12)]))
  monkeypatch.setattr(attention, "rotate_rows", lambda x_BT, by_B: x_BT)
  out_right = attention.fused_attention(q, k, v, right, implementation="xla")
  vis = visible_BT(np.asarray(right))
  np.testing.assert_allclose(np.asarray(out_right)[vis],
                             np.asarray(attention.einsum_attention(q, k, v, right))[vis],
                             atol=1e-5, rtol=1e-5)
  out_left = attention.fused_attention(q, k, v, left, implementation="xla")
  vis = visible_BT(np.asarray(left))
  assert not np.allclose(np.asarray(out_left)[vis],
                         np.asarray(attention.einsum_attention(q, k, v, left))[vis], atol=1e-3)


def fsdp_sharding():
  """Rows over a 2-device 'fsdp' axis of an Auto mesh (as the trainer's meshes are)."""
  mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2],
                       axis_types=(jax.sharding.AxisType.Auto,))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))


@pytest.fixture
def fake_gpu(monkeypatch):
  """Pretends the activations live on GPUs and records what dot_product_attention is asked
  for, running it with the XLA implementation (no GPU compile)."""
  calls = []
  real = jax.nn.dot_product_attention

  def recording(*args, implementation=None, **kwargs):
    calls.append(implementation)
    # Under jit (fused_attention's cond) XLA:CPU cannot run the XLA implementation's
    # float16 matmuls (their F16_F16_F32 algorithm): the stand-in runs float16 in float32.
    f16 = args[0].dtype == jnp.float16
    if f16:
      args = tuple(a.astype(jnp.float32) for a in args)
    out = real(*args, implementation="xla", **kwargs)
    return out.astype(jnp.float16) if f16 else out

  monkeypatch.setattr(attention, "platform", lambda sharding: "gpu")
  monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
  return calls


@pytest.mark.parametrize("dtype,h,want", [
    (jnp.bfloat16, 128, "cudnn"), (jnp.float16, 64, "cudnn"),
    # float32 compute and head dims cuDNN does not take go through the einsum
    (jnp.float32, 128, "einsum"), (jnp.bfloat16, 12, "einsum"), (jnp.bfloat16, 512, "einsum"),
])
def test_auto_picks_cudnn_on_a_gpu_mesh(fake_gpu, dtype, h, want):
  sharding = fsdp_sharding()
  assert attention.auto_impl(sharding, dtype, h) == want
  q, k, v = random_qkv(2, 8, 4, 2, h, dtype)
  mask = jnp.asarray(row_masks(8, [(0, 8), (0, 5)]))
  out = attention.causal_attention(q, k, v, mask, sharding=sharding)
  # Traced once in each branch of `fused_attention`'s left-padding cond.
  assert fake_gpu == (["cudnn"] * 2 if want == "cudnn" else [])
  vis = visible_BT(np.asarray(mask))
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(out, np.float32)[vis],
                             np.asarray(attention.einsum_attention(q, k, v, mask), np.float32)[vis],
                             atol=tol, rtol=tol)


def test_auto_without_a_sharding_follows_the_default_backend(fake_gpu):
  assert attention.auto_impl(None, jnp.bfloat16, 128) == "cudnn"


def test_auto_stays_einsum_on_cpu():
  assert attention.auto_impl(fsdp_sharding(), jnp.bfloat16, 128) == "einsum"
  assert attention.auto_impl(None, jnp.bfloat16, 128) == "einsum"


def test_explicit_cudnn_refuses_what_cudnn_cannot_run():
  q, k, v = random_qkv(1, 4, 2, 1, 8, jnp.float32)
  with pytest.raises(ValueError, match="bfloat16 or float16"):
    attention.causal_attention(q, k, v, jnp.ones((1, 4), bool), impl="cudnn")


# Fused forwards per layer: remat reruns the kernel unless the policy keeps its output and
# softmax statistics ("attention", "context" and "matmuls" keep them, like the splash
# kernel's).
CUDNN_FORWARDS = {"none": 1, "full": 2, "dots": 2, "attention": 1, "context": 1, "matmuls": 1}


@pytest.mark.parametrize("remat", sorted(CUDNN_FORWARDS))
def test_cudnn_train_path_passes_cudnns_checks_and_lowers_for_cuda(monkeypatch, remat):
  """The model's cuDNN path as the GPU's train step runs it (bf16, gradients), lowered for
  CUDA on this CPU: jax's own cuDNN argument checks (dtypes, layouts, the int32 key
  lengths, head dim) run at trace time, and the program holds the fused forward (rerun
  under remat where the policy drops its residuals) and the fused backward, not the
  einsum. Only the two hardware queries those checks make (cuDNN's version, the GPU's
  compute capability) are answered here as an H100 with cuDNN 9.10 would; nothing is
  compiled."""
  import dataclasses
  import re

  from flax import nnx
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

  from jaxrl_scale.models import config as model_config
  from jaxrl_scale.models import transformer

  monkeypatch.setattr(cudnn_fa, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(cudnn_fa, "check_compute_capability", lambda capability: True)
  monkeypatch.setattr(cudnn_fa, "is_cuda_compute_capability_equal", lambda capability: False)
  cfg = dataclasses.replace(model_config.tiny_qwen3(), param_dtype="bfloat16",
                            dtype="bfloat16", attention_impl="cudnn")
  graphdef, params = nnx.split(transformer.create_model(cfg))

  def loss(params, tokens_BT, positions_BT, mask_BT):
    model = nnx.merge(graphdef, params)
    h_BTD = model.hidden_states(tokens_BT, positions_BT, mask_BT, remat=remat)
    return jnp.sum(h_BTD.astype(jnp.float32) ** 2)

  b, t = 2, 64
  args = (params, jax.ShapeDtypeStruct((b, t), jnp.int32),
          jax.ShapeDtypeStruct((b, t), jnp.int32), jax.ShapeDtypeStruct((b, t), jnp.bool_))
  text = jax.jit(jax.grad(loss)).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"custom_call @(__cudnn\$\w+)", text)
  # One scanned layer body, holding the forward(s) and the backward once: the model
  # right-aligns its rows before the layers (`Transformer._aligns_rows`), so no layer runs
  # `fused_attention`'s left-padding cond (whose two branches would each hold them).
  assert sorted(calls) == sorted(["__cudnn$fmhaSoftmax"] * CUDNN_FORWARDS[remat]
                                 + ["__cudnn$fmhaSoftmaxBackward"])
