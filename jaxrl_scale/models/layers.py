"""Decoder building blocks: RMSNorm, RoPE (with Llama 3.1 scaling), GQA attention, SwiGLU.

Every parameter carries its logical axis names in the `out_sharding` metadata (with eager
sharding off, so nothing is placed at creation); `models.sharding` maps them onto a mesh.

Logical axes: 'vocab' V, 'embed' D, 'q_heads' N, 'kv_heads' K, 'head_dim' H, 'mlp' F,
'norm' (RMSNorm scales; always replicated); the experts of `models.moe` add 'expert' and
'moe_mlp'. The transformer stacks its layers, which puts a
'layers' axis (never sharded) first on every layer parameter.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxrl_scale.models import attention
from jaxrl_scale.models.config import ModelConfig, RopeScaling

# (q_BTNH, k_BTKH, v_BTKH) -> (out_BTNH, aux); see `Attention.__call__`.
Attend = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]


def param(value: jax.Array, axes: tuple[str | None, ...], *,
          float32_grad: bool = False) -> nnx.Param:
  """A parameter annotated with logical axes, never sharded eagerly.

  `float32_grad`: the model reads this parameter in float32 (the MoE router, the FP32 LM
  head) or sums its gradient in the parameter's own dtype (the embedding gather, whose
  transpose is a scatter-add). Every other parameter is read rounded to the compute dtype,
  so its gradient arrives in that dtype; the trainer then differentiates a compute-dtype
  copy made once per step instead of the float32 master (`rl.train_step`), which is the
  same gradient in less memory. A parameter used in float32 but not marked would have its
  gradient rounded to bf16: mark it.
  """
  if float32_grad:
    return nnx.Param(value, out_sharding=axes, eager_sharding=False, float32_grad=True)
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def held(w: jax.Array, param_dtype: Any) -> jax.Array:
  """`w` as the model computes with it: rounded to `param_dtype`, gradients straight through.

  The model's function is the one its `param_dtype` weights define, whatever precision the
  array carries. The generator holds a param_dtype copy, so this is a no-op there; the
  trainer holds float32 masters of a bf16 model, and without the rounding its forward would
  be a slightly different policy from the one the generator sampled (the float32 LM head
  read the unrounded master: on-policy log-prob gaps of ~1e-3, issue 33). The gradient
  passes to the float32 master unrounded, as if the rounding were not there, so updates
  smaller than a bf16 spacing still accumulate in the master.
  """
  want = jnp.dtype(param_dtype)
  if w.dtype == want or not jnp.issubdtype(w.dtype, jnp.floating):
    return w
  return _round_through(w, want)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _round_through(w: jax.Array, dtype: jnp.dtype) -> jax.Array:
  if w.dtype == jnp.float32 and dtype == jnp.bfloat16:
    return rounded(w, dtype)  # a round trip through bfloat16 may be dropped (`rounded`)
  return w.astype(dtype).astype(w.dtype)


def _round_through_fwd(w, dtype):
  return _round_through(w, dtype), None


def _round_through_bwd(dtype, _, g):
  del dtype
  return (g,)


_round_through.defvjp(_round_through_fwd, _round_through_bwd)


def fp32_logits(h_BTD: jax.Array, w: jax.Array, spec: str, param_dtype: Any,
                w16: jax.Array | None = None) -> jax.Array:
  """ScaleRL's FP32 LM head: float32 logits `einsum(spec, h_BTD, w)`, where `w` holds
  `param_dtype` values (`Transformer.head`: the generator's copy, or the trainer's float32
  master rounded by `held`). `w16`: `fp32_head_operand(w, ...)` taken by a caller that runs
  the head over chunks in a loop, once outside it (the cast is then not in every chunk);
  the gradient still goes to w.

  When the activations and the weights are both of one 16-bit type, every product of the
  matmul is exact in float32 (8 + 8 significant bits for bfloat16, 11 + 11 for float16,
  within float32's 24): a float32 matmul of the widened operands and a 16-bit matmul that
  accumulates in float32 compute the same sum, up to the order of the float32 additions.
  The forward then runs as the latter: the 16-bit operands as they are (no float32 copy of
  the [V, D] head) in one pass of the TPU's MXU or a GPU's tensor cores, where the float32
  matmul at HIGHEST precision takes six MXU passes on a TPU and runs on CUDA cores (no
  tensor cores) on a GPU.

  The backward's cotangent g is float32. For bfloat16 it splits exactly into three
  bfloat16 pieces (hi + mid + lo: 3 x 8 significant bits, bfloat16 having float32's
  exponent range), each of whose products with the 16-bit operand is again exact.
  dw = h^T g runs as two bf16 passes, over hi and mid, summed in float32 (lo is under 2^-16
  of g): float32 for the float32 master, within about 3e-6 of the exact gradient
  (relative, in norm, on RL-shaped cotangents), where the float32 matmul is within 3e-7
  and a bfloat16 cotangent, as every other weight gradient of a bf16 model gets, 2e-3.
  dh = g w, which goes on in bfloat16 into the layers below (each of whose backward
  passes rounds its cotangent to bf16 again), runs as one pass over hi: the bf16
  cotangent a model without the FP32 head gives its last hidden state, off the exact dh
  by 2.4e-3 in norm where its correctly rounded bf16 value is off by 1.7e-3.
  float16's backward (too narrow an exponent range for the pieces) is the float32 matmul
  at HIGHEST precision, and so is all of the head for any other pair of dtypes.
  """
  if w16 is None or w16.dtype != h_BTD.dtype:
    w16 = fp32_head_operand(w, h_BTD.dtype, param_dtype)
  if w16 is not None:
    return _exact_16bit_logits(h_BTD, w, w16, spec)
  return _fp32_einsum(spec, h_BTD, w)


def fp32_head_operand(w: jax.Array, dtype: Any, param_dtype: Any) -> jax.Array | None:
  """The 16-bit weights `fp32_logits` multiplies activations of `dtype` with (w cast to
  that dtype, outside autodiff: `fp32_logits` sends the gradient to w itself), or None
  where it multiplies in float32 (other pairs of dtypes)."""
  narrow = jnp.dtype(dtype)
  if narrow.itemsize == 2 and jnp.issubdtype(narrow, jnp.floating) and (
      jnp.dtype(param_dtype) == narrow):
    return jax.lax.stop_gradient(w).astype(narrow)
  return None


def _fp32_einsum(spec: str, h: jax.Array, w: jax.Array) -> jax.Array:
  return jnp.einsum(spec, h.astype(jnp.float32), w.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def bf16_pieces(x: jax.Array, n: int = 3) -> jax.Array:
  """float32 x as [n, ...] bfloat16 pieces, largest first. All three (n=3) sum back to x in
  float32 (exactly but for x within 2^16 of float32's smallest normal number, where pieces
  go subnormal); the first two to x within 2^-16 of x (round to nearest twice).

  The rounding is `reduce_precision`, not a float32 -> bfloat16 -> float32 round trip: XLA
  may drop such a pair as a no-op ("excess precision", on by default; XLA:GPU's
  simplify-fp-conversions pass), which would make the lower pieces zero."""
  hi = rounded(x, jnp.bfloat16)
  rest = x - hi
  mid = rounded(rest, jnp.bfloat16)
  return jnp.stack([hi, mid, rest - mid][:n]).astype(jnp.bfloat16)  # each exactly bf16


def rounded(x: jax.Array, dtype: Any) -> jax.Array:
  """x rounded to `dtype`'s values (nearest even), keeping x's dtype: for bfloat16 from
  float32 the same numbers as x.astype(dtype).astype(x.dtype), but in an op XLA keeps
  (`reduce_precision`), where it may drop the cast round trip as a no-op."""
  info = jnp.finfo(dtype)
  return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _exact_16bit_logits(h_BTD: jax.Array, w: jax.Array, w16: jax.Array, spec: str
                        ) -> jax.Array:
  """The logits from w16 (w in h's dtype); the gradient goes to w, none to w16."""
  return jnp.einsum(spec, h_BTD, w16, preferred_element_type=jnp.float32)


def _exact_16bit_logits_fwd(h_BTD, w, w16, spec):
  return _exact_16bit_logits(h_BTD, w, w16, spec), (h_BTD, w, w16)


def _exact_16bit_logits_bwd(spec, res, g):
  h_BTD, w, w16 = res
  if h_BTD.dtype != jnp.bfloat16:
    _, vjp = jax.vjp(functools.partial(_fp32_einsum, spec), h_BTD, w)
    return (*vjp(g), None)
  inputs, out = spec.split("->")
  lhs, rhs = inputs.split(",")
  g_K = bf16_pieces(g, 2)
  # The head's [tokens, V] matmuls a chunk are the forward, its recompute
  # (`rl/logprobs.py`) and these three. dh dropped the third piece first (it is returned
  # in bf16: 703 -> 682 ms on the qwen3_0p6b 32 x 2048 train step compiled for an H100),
  # dw next (its relative error 3e-7 -> 3e-6, `tests/models/layers_test.py`; 669 -> 641 ms
  # and 4.6 GiB fewer temporaries, the cotangent's pieces written once fewer as well;
  # qwen3_1p7b 16 x 4096 1.49 -> 1.44 s; the 8B recipe on v5p-128 130 -> 127 s), then dh
  # its second (2026-11-27: qwen3_1p7b 16 x 4096's matmul kernels 948 -> 907 ms a step,
  # compiled for an H100; on the H100 its matmuls ran at 1.49x their bound, ~61 ms of a
  # 2.29 s step). One matmul per piece, summed smallest first. Contracting the pieces side
  # by side in one matmul (w read once) gave the [K, B, T, D] float32 dh and its operands their own
  # buffers: +5.1 GB of temporaries on the qwen3_0p6b train step compiled for an H100; for
  # dw, XLA:TPU built the whole [V, D] on every chip (+4.6 GiB on the 8B recipe), and
  # XLA:GPU wrote the stacked pieces with a separate concatenate (+35 ms, +4.6 GiB on the
  # 0.6B step). Each dw matmul is the float32 head's, so it is split over the devices as
  # that one was.
  dh = jnp.einsum(f"{out},{rhs}->{lhs}", g_K[0], w16, preferred_element_type=jnp.float32)
  dw = (jnp.einsum(f"{lhs},{out}->{rhs}", h_BTD, g_K[1], preferred_element_type=jnp.float32)
        + jnp.einsum(f"{lhs},{out}->{rhs}", h_BTD, g_K[0], preferred_element_type=jnp.float32))
  return dh.astype(h_BTD.dtype), dw.astype(w.dtype), None


_exact_16bit_logits.defvjp(_exact_16bit_logits_fwd, _exact_16bit_logits_bwd)


def residual(x_BTD: jax.Array, y_BTD: jax.Array) -> jax.Array:
  """x + y, rounded to their dtype in every program that computes it.

  A bf16 residual sum feeds float32 work (the next RMSNorm, the next add), and XLA may keep
  it in float32 instead of rounding it ("excess precision", on by default), or not,
  depending on the program around it: the sampler's decode, whose layers run unrolled, kept
  each layer's output in float32 where the trainer's layer loop (a scan carry) rounded it,
  so the two sides were different policies (on-policy mean |dlogp| 5e-4, max 3e-3 on a
  2-layer bf16 model with the FP32 head; issue 33). `lax.reduce_precision`, which XLA
  keeps, rounds it here in every program: the bf16 residual stream as written (and as
  Hugging Face computes it); on the qwen3_0p6b train step compiled for v5p, +0.5% bytes
  accessed. Float32 sums are plain adds.
  """
  dtype = jnp.result_type(x_BTD, y_BTD)
  if not jnp.issubdtype(dtype, jnp.floating) or jnp.finfo(dtype).bits >= 32:
    return x_BTD + y_BTD
  sum_BTD = x_BTD.astype(jnp.float32) + y_BTD.astype(jnp.float32)
  return rounded(sum_BTD, dtype).astype(dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis, computed in float32 as Hugging Face does."""

  def __init__(self, dim: int, eps: float, param_dtype: jnp.dtype):
    self.scale = param(jnp.ones((dim,), param_dtype), ("norm",))
    self.eps = eps
    self.param_dtype = jnp.dtype(param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    # HF casts back before the scale multiply; same order keeps bf16 parity.
    scale = held(self.scale[...], self.param_dtype).astype(x.dtype)
    return scale.reshape((1,) * (x.ndim - 1) + scale.shape) * x32.astype(x.dtype)


class Einsum(nnx.Module):
  """A projection `x @ kernel (+ bias)` written as an einsum with named axes."""

  def __init__(self, spec: str, shape: tuple[int, ...], axes: tuple[str | None, ...], *,
               rngs: nnx.Rngs, param_dtype: jnp.dtype, dtype: jnp.dtype,
               bias_axes: tuple[str | None, ...] | None = None, float32_grad: bool = False):
    _contraction(spec)  # a spec it cannot compute fails here, not at the first call
    self.spec = spec
    self.dtype = dtype
    self.param_dtype = jnp.dtype(param_dtype)
    init = nnx.initializers.normal(stddev=0.02)
    self.kernel = param(init(rngs.params(), shape, param_dtype), axes,
                        float32_grad=float32_grad)
    if bias_axes is not None:
      bias_shape = shape[len(shape) - len(bias_axes):]
      self.bias = param(jnp.zeros(bias_shape, param_dtype), bias_axes)
    else:
      self.bias = None

  def compute_kernel(self) -> jax.Array:
    """The kernel as the matmul takes it: the compute dtype, of `param_dtype` values."""
    kernel = self.kernel[...]
    if jnp.dtype(self.dtype) != self.param_dtype:
      # Casting to the compute dtype rounds at least as much as param_dtype when the two
      # agree; only a wider compute dtype needs `held` (which costs the train step a rounded
      # copy of the layer weights: +1.0 GiB of temporaries on qwen3_1p7b / v5p-8).
      kernel = held(kernel, self.param_dtype)
    return kernel.astype(self.dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    dims, perm = _contraction(self.spec)
    # A dot_general with the contracted axes in x's order, not jnp.einsum: for "BTNH,NHD"
    # einsum contracted (H, N), and XLA:CPU then transposed the whole kernel on every call
    # (o_proj, every decode step; benchmarks/sampler/sampler_bench.py).
    kernel = self.compute_kernel()
    lead = None
    if _FLAT.get() and perm is None and _trailing_into_leading(dims, x.ndim):
      lead, free = x.shape[:x.ndim - len(dims[0][0])], kernel.shape[len(dims[0][1]):]
      x = x.reshape(math.prod(lead), -1)
      kernel = kernel.reshape(x.shape[1], -1)
      dims = (((1,), (0,)), ((), ()))
    # Returned in float32 and rounded to the compute dtype once, after the whole sum. Asked
    # for bf16 output, XLA:CPU's dot gave a row different bf16 values depending on how many
    # rows it multiplied (the sampler's decode rows vs the trainer's B x T), and a
    # contraction split over devices (tp, or fsdp where the partitioner splits it) added
    # bf16 partial sums: the sampler and the trainer were different policies (issue 33;
    # docs/sampler.md, Numerics). TPUs accumulate in float32 anyway; the qwen3_0p6b train
    # step compiled for v5p: bytes accessed +1.4%, FLOPs and temporaries unchanged.
    # The algorithm says what the operands are: 16-bit, multiplied exactly, summed in float32.
    # Without it the backward pass multiplied float32 operands: the cotangent of this
    # float32 output is float32 (of 16-bit values), so autodiff's transposed dots took it
    # with the 16-bit weights widened, and XLA:GPU ran them as float32 matmuls (TF32, half
    # the bf16 tensor-core rate; 2/3 of a train step's matmul FLOPs). Same values.
    y = jax.lax.dot_general(x.astype(self.dtype), kernel, dims,
                            precision=HALF_ALGORITHMS.get(jnp.dtype(self.dtype)),
                            preferred_element_type=jnp.float32).astype(self.dtype)
    if lead is not None:
      y = y.reshape(lead + free)
    if perm is not None:
      y = jnp.transpose(y, perm)
    if self.bias is not None:
      bias = held(self.bias[...], self.param_dtype).astype(self.dtype)
      y = y + bias.reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
    return y


# Dot algorithms of 16-bit operands with float32 sums (what a 16-bit compute dtype's
# projections run), by compute dtype; none for float32.
HALF_ALGORITHMS = {jnp.dtype(jnp.bfloat16): jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
                   jnp.dtype(jnp.float16): jax.lax.DotAlgorithmPreset.F16_F16_F32}


# Whether projections run as 2-D matmuls (`flat_projections`), read while tracing.
_FLAT = contextvars.ContextVar("flat_projections", default=False)


@contextlib.contextmanager
def flat_projections(enabled: bool = True) -> Iterator[None]:
  """Within it (while a program is traced), an `Einsum` that contracts the activations'
  trailing axes with the kernel's leading ones, and the LM head (`flat_rows`), multiply
  [B*T, D] x [D, F] matrices: the same sums, as 2-D matmuls. On XLA:CPU the backward pass
  of a [B, T, D] projection ran 2.3x slower than the same matmul on [B*T, D] (a SwiGLU MLP,
  128 x 24 tokens, hidden 128; the loop task's whole train step 1.5x:
  benchmarks/peers/profile_loop.py), so the trainer traces its step inside this on CPU
  (`placement.cpu_program`). Not on TPUs: there the reshapes are copies (the qwen3_0p6b
  train step compiled for v5p-8 read 47% more bytes); compiled for an H100 it changed
  nothing."""
  token = _FLAT.set(enabled)
  try:
    yield
  finally:
    _FLAT.reset(token)


def flat_rows(h_BTD: jax.Array, spec: str, fn: Callable[[jax.Array, str], jax.Array]
              ) -> jax.Array:
  """`fn(h, spec)` (an LM head: spec "BTD,..->BTV"), under `flat_projections` on the rows
  [B*T, D] with spec "TD,..->TV", the result reshaped back to [B, T, V]."""
  if not _FLAT.get() or h_BTD.ndim != 3 or not spec.startswith("BT"):
    return fn(h_BTD, spec)
  b, t, d = h_BTD.shape
  out = fn(h_BTD.reshape(b * t, d), spec.replace("BT", "T"))
  return out.reshape(b, t, out.shape[-1])


def _trailing_into_leading(dims: Any, ndim: int) -> bool:
  """Whether dot_general `dims` contract x's last axes, in order, with the kernel's first."""
  (lhs, rhs), _ = dims
  n = len(lhs)
  return 0 < n < ndim and lhs == tuple(range(ndim - n, ndim)) and rhs == tuple(range(n))


@functools.lru_cache(maxsize=None)
def _contraction(spec: str) -> tuple[Any, tuple[int, ...] | None]:
  """dot_general dimension numbers of a two-operand einsum `spec` without batch axes
  ("BTD,DNH->BTNH"): the axes both operands share are contracted, in the first operand's
  order, and the output permutation (None when dot_general's own order, free axes of the
  first operand then of the second, is already the spec's)."""
  ins, out = spec.split("->")
  lhs, rhs = ins.split(",")
  shared = [c for c in lhs if c in rhs]
  if any(c in out for c in shared) or sorted(out) != sorted(
      [c for c in lhs + rhs if c not in shared]):
    raise ValueError(f"Einsum {spec!r}: only contractions without batch axes are supported")
  dims = ((tuple(lhs.index(c) for c in shared), tuple(rhs.index(c) for c in shared)), ((), ()))
  natural = [c for c in lhs if c not in shared] + [c for c in rhs if c not in shared]
  perm = tuple(natural.index(c) for c in out)
  return dims, None if perm == tuple(range(len(out))) else perm


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """Inverse frequencies [H/2] (float32), with Llama 3.1 'llama3' scaling when given.

  llama3 scaling leaves high frequencies (wavelength < original_len / high_freq_factor)
  alone, divides low frequencies (wavelength > original_len / low_freq_factor) by `factor`
  and interpolates smoothly between.
  """
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  if scaling is not None:
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / scaling.low_freq_factor,
                      inv_freq / scaling.factor, inv_freq)
    smooth = ((old_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= old_len / scaling.high_freq_factor) & (
        wavelen <= old_len / scaling.low_freq_factor)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def apply_rope(x_BTNH: jax.Array, positions_BT: jax.Array, inv_freq_h: np.ndarray) -> jax.Array:
  """Rotates halves of the head dim (the HF `rotate_half` convention), in float32."""
  angle_BTh = positions_BT.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq_h)[None, None, :]
  cos_BT1h = jnp.cos(angle_BTh)[:, :, None, :]
  sin_BT1h = jnp.sin(angle_BTh)[:, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos_BT1h - x2 * sin_BT1h, x2 * cos_BT1h + x1 * sin_BT1h], axis=-1)
  return out.astype(x_BTNH.dtype)


class Attention(nnx.Module):
  """Grouped-query attention; query head n reads kv head n // (N / K), as in HF."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pd, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
    bias = ("q_heads", "head_dim") if cfg.qkv_bias else None
    kv_bias = ("kv_heads", "head_dim") if cfg.qkv_bias else None
    kw = dict(rngs=rngs, param_dtype=pd, dtype=dt)
    self.q_proj = Einsum("BTD,DNH->BTNH", (d, n, h), ("embed", "q_heads", "head_dim"),
                         bias_axes=bias, **kw)
    self.k_proj = Einsum("BTD,DKH->BTKH", (d, k, h), ("embed", "kv_heads", "head_dim"),
                         bias_axes=kv_bias, **kw)
    self.v_proj = Einsum("BTD,DKH->BTKH", (d, k, h), ("embed", "kv_heads", "head_dim"),
                         bias_axes=kv_bias, **kw)
    self.o_proj = Einsum("BTNH,NHD->BTD", (n, h, d), ("q_heads", "head_dim", "embed"), **kw)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.rms_norm_eps, pd)
      self.k_norm = RMSNorm(h, cfg.rms_norm_eps, pd)
    else:
      self.q_norm = self.k_norm = None
    # Static (hashable) settings: the frequencies are rebuilt in numpy at trace time.
    self.rope = (h, cfg.rope_theta, cfg.rope_scaling)
    self.num_kv_heads = k

  def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array, attend: Attend,
               ) -> tuple[jax.Array, Any]:
    """Attention output [B, T, D] and whatever `attend` returns beside its output.

    Args:
      x_BTD: normalised input.
      positions_BT: RoPE positions of the T tokens.
      attend: (q_BTNH, k_BTKH, v_BTKH) -> (out_BTNH, aux): the attention itself, with RoPE
        (and the qk norms) already applied. The caller picks the full-sequence kernel or
        the paged KV-cache write and read (`paged_attention.paged_attention`), so one layer
        serves both paths.
    """
    # The names let a remat policy keep these (transformer.REMAT_POLICIES "attention").
    q_BTNH = checkpoint_name(self.q_proj(x_BTD), "query_proj")
    k_BTKH = checkpoint_name(self.k_proj(x_BTD), "key_proj")
    v_BTKH = checkpoint_name(self.v_proj(x_BTD), "value_proj")
    if self.q_norm is not None:
      q_BTNH = self.q_norm(q_BTNH)
      k_BTKH = self.k_norm(k_BTKH)
    inv_freq_h = rope_frequencies(*self.rope)
    q_BTNH = apply_rope(q_BTNH, positions_BT, inv_freq_h)
    k_BTKH = apply_rope(k_BTKH, positions_BT, inv_freq_h)
    out_BTNH, aux = attend(q_BTNH, k_BTKH, v_BTKH)
    return checkpoint_name(self.o_proj(out_BTNH.astype(q_BTNH.dtype)), "out_proj"), aux


@jax.custom_vjp
def stacked_swiglu(gu_BT2F: jax.Array) -> jax.Array:
  """silu(gate) * up of gate and up side by side ([..., 2, F], `MLP(stack=True)`).

  The forward is jax's (`jax.nn.silu` in the input's dtype). The backward is written out:
  autodiff takes the two halves' cotangents as two pads of [..., 2, F] and their sum, which
  XLA:GPU emits as one elementwise pass reading every input element by element (28 scalar
  2-byte loads a thread, no vector load: the one such kernel of the qwen3_1p7b train step
  compiled for an H100; 58 ms of the 2.3 s step measured on one, 1.7x its roofline). Here
  one elementwise expression over [..., 2, F] reads each row's gate, up and cotangent as
  vectors and picks its half's derivative (float32 inside, rounded once to the input's
  dtype): the same bytes, three vector loads and a vector store for four elements."""
  return jax.nn.silu(gu_BT2F[..., 0, :]) * gu_BT2F[..., 1, :]


def _stacked_swiglu_fwd(gu_BT2F):
  return stacked_swiglu(gu_BT2F), gu_BT2F


def _stacked_swiglu_bwd(gu_BT2F, dh_BTF):
  # Each element of [..., 2, F] reads its row's gate, up and dh (broadcast over the pair
  # axis, so its loads are plain vector loads) and picks its half's derivative:
  # d/dgate = dh * up * sig * (1 + gate * (1 - sig)), d/dup = dh * silu(gate).
  f32 = jnp.float32
  g = gu_BT2F[..., 0:1, :].astype(f32)
  u = gu_BT2F[..., 1:2, :].astype(f32)
  dh = dh_BTF[..., None, :].astype(f32)
  sig = jax.nn.sigmoid(g)
  is_gate = jax.lax.broadcasted_iota(jnp.int32, gu_BT2F.shape, gu_BT2F.ndim - 2) == 0
  d = jnp.where(is_gate, dh * u * sig * (1.0 + g * (1.0 - sig)), dh * g * sig)
  return (d.astype(gu_BT2F.dtype),)


stacked_swiglu.defvjp(_stacked_swiglu_fwd, _stacked_swiglu_bwd)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)); F is cfg.intermediate_size unless given."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, intermediate_size: int | None = None):
    d, f = cfg.hidden_size, intermediate_size or cfg.intermediate_size
    kw = dict(rngs=rngs, param_dtype=jnp.dtype(cfg.param_dtype), dtype=jnp.dtype(cfg.dtype))
    self.gate_proj = Einsum("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
    self.up_proj = Einsum("BTD,DF->BTF", (d, f), ("embed", "mlp"), **kw)
    self.down_proj = Einsum("BTF,FD->BTD", (f, d), ("mlp", "embed"), **kw)

  def __call__(self, x_BTD: jax.Array, sharding: jax.sharding.NamedSharding | None = None,
               *, stack: bool | None = None) -> jax.Array:
    """`stack`: gate and up as one matmul over their kernels side by side ([D, 2, F]; the
    same sums). None: on GPUs (`attention.platform(sharding)`) when the tokens outnumber
    the hidden size. XLA:GPU then writes the backward's [B, T, 2, F] cotangent in one
    elementwise pass (not a pass per half) and takes dx in one matmul (not two and an add):
    compiled for an H100, the qwen3_0p6b 32 x 2048 train step 630 -> 621 ms kernel by
    kernel, qwen3_1p7b 16 x 4096 1.431 -> 1.413 s. Not with few tokens (decode): the stacked
    kernel is a copy of both, and decode's bytes are the weights' (Qwen3-0.6B decode at
    batch 64 on an H100: 1.26x -> 1.37x the least bytes a step reads). Not on TPUs, where
    XLA already fuses the SwiGLU around the separate matmuls and the stacked [B, T, 2, F]
    output costs memory for no time (the 8B recipe on v5p-128: train step +0.75 GiB,
    prefill +1.77 GiB a chip, the same bounds)."""
    gate, up = self.gate_proj, self.up_proj
    if stack is None:
      b, t, d = x_BTD.shape
      stack = b * t > d and attention.platform(sharding) == "gpu"
    if not stack:
      return self.down_proj(jax.nn.silu(gate(x_BTD)) * up(x_BTD))
    kernel_D2F = jnp.stack([gate.compute_kernel(), up.compute_kernel()], axis=1)
    gu_BT2F = jax.lax.dot_general(
        x_BTD.astype(gate.dtype), kernel_D2F, (((2,), (0,)), ((), ())),
        precision=HALF_ALGORITHMS.get(jnp.dtype(gate.dtype)),
        preferred_element_type=jnp.float32).astype(gate.dtype)
    return self.down_proj(stacked_swiglu(gu_BT2F))
