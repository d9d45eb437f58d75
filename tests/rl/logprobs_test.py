"""The chunked LM head's hand-written backward pass (`logprobs._recomputed_head`) against a
float64 hand computation, and its structure: the backward reruns the logits matmul and
nothing else of the forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import layers
from jaxrl_scale.models import transformer
from jaxrl_scale.rl import logprobs

B, T, D, V = 2, 5, 48, 37


def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.standard_normal((B, T, D)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((V, D)) * 0.3, jnp.bfloat16)
  targets = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
  g = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)  # not +-1: scales must show
  return h, w, targets, g


def _float64_reference(h, w, targets, g, temperature):
  """log p_T(target) and d(sum g * logp)/d(h, w) by hand, in float64."""
  h64, w64 = np.asarray(h, np.float64), np.asarray(w, np.float64)
  z = np.einsum("btd,vd->btv", h64, w64) / temperature
  lse = z.max(-1) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1))
  t = np.asarray(targets)
  logp = np.take_along_axis(z, t[..., None], -1)[..., 0] - lse
  onehot = np.arange(V)[None, None, :] == t[..., None]
  dlogits = np.asarray(g, np.float64)[..., None] * (onehot - np.exp(z - lse[..., None]))
  dlogits /= temperature
  return logp, np.einsum("btv,vd->btd", dlogits, w64), np.einsum("btv,btd->vd", dlogits, h64)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_head_matches_float64_by_hand(temperature):
  """The FP32 head of bf16 operands (the recipe's case): log-probs and both gradients
  against float64 NumPy. A wrong 1/T, softmax or target term in the backward fails."""
  h, w, targets, g = _inputs()
  logits_fn = lambda h_, w_: layers.fp32_logits(h_, w_, "BTD,VD->BTV", jnp.bfloat16)

  def loss(h_, w_):
    logp, top1 = logprobs._recomputed_head(logits_fn, h_, w_, targets, temperature)
    return jnp.sum(logp * g), (logp, top1)

  (dh, dw), (logp, top1) = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(h, w)
  want_logp, want_dh, want_dw = _float64_reference(h, w, targets, g, temperature)
  np.testing.assert_allclose(np.asarray(logp), want_logp, atol=2e-5)
  z = np.einsum("btd,vd->btv", np.asarray(h, np.float64), np.asarray(w, np.float64))
  np.testing.assert_array_equal(np.asarray(top1),
                                z.argmax(-1) == np.asarray(targets))
  # The gradients come back in the operands' dtype (bfloat16): rounding of 2^-8.
  assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  for got, want in ((dh, want_dh), (dw, want_dw)):
    np.testing.assert_allclose(np.asarray(got, np.float64), want,
                               atol=4e-3 * np.abs(want).max(), rtol=4e-3)


def test_max_and_sum_exp_matches_float64():
  """The one-pass (max, sum of exp(z - max)) against float64 NumPy, over logits spanning
  60 nats, rows holding -inf entries and a row of -inf but one; the max exactly."""
  rng = np.random.default_rng(7)
  z = rng.standard_normal((5, 3, 1031)) * 12
  z[1, 2, rng.choice(1031, 900, replace=False)] = -np.inf
  z[4, 0] = -np.inf
  z[4, 0, 17] = 3.5
  z32 = jnp.asarray(z, jnp.float32)
  m, s = jax.jit(logprobs.max_and_sum_exp)(z32)
  z64 = np.asarray(z32, np.float64)
  want_m = z64.max(-1)
  np.testing.assert_array_equal(np.asarray(m, np.float64), want_m)
  want_s = np.exp(z64 - want_m[..., None]).sum(-1)
  np.testing.assert_allclose(np.asarray(s, np.float64), want_s, rtol=2e-6)
  assert float(s[4, 0]) == 1.0


def _reduce_max_count(jaxpr) -> int:
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name in ("reduce_max", "reduce")  # `max_and_sum_exp`: a "reduce"
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
        if hasattr(sub, "eqns"):
          n += _reduce_max_count(sub)
  return n


def test_chunked_head_backward_reruns_only_the_matmul():
  """The gradient of the chunked head holds one max over the vocabulary (the forward's):
  the backward pass recomputes the logits but not the reductions (under jax.checkpoint
  it held two, and wrote d(logits) in float32 before casting it)."""
  cfg = model_config.ModelConfig(family="llama", vocab_size=V, hidden_size=D, num_layers=1,
                                 num_heads=4, num_kv_heads=2, head_dim=12,
                                 intermediate_size=64, param_dtype="bfloat16",
                                 dtype="bfloat16")
  model = transformer.create_model(cfg)
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, V, (B, 13)), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(13), (B, 13))
  mask = jnp.ones((B, 13), bool)

  def objective(p, chunk):
    logp, _ = logprobs.token_logprobs(nnx.merge(graphdef, p), tokens, pos, mask, chunk,
                                      temperature=0.7)
    return jnp.sum(logp)

  # The layers' RMSNorm and softmax have no max over a [.., V] axis; count them all the
  # same by comparing with the unchunked head, whose autodiff keeps the forward's max.
  # (The chunked head's values and gradients against the unchunked ones: train_step_test.)
  counts = {c: _reduce_max_count(jax.make_jaxpr(jax.grad(functools.partial(
      objective, chunk=c)))(params).jaxpr) for c in (0, 4)}
  assert counts[4] == counts[0], counts


def _casts_of_head_in_loops(jaxpr, head_shape, in_loop=False) -> int:
  """float32 -> bfloat16 casts of a `head_shape` array inside scan bodies of `jaxpr`."""
  n = 0
  for eqn in jaxpr.eqns:
    if (in_loop and eqn.primitive.name == "convert_element_type"
        and eqn.invars[0].aval.shape == head_shape
        and eqn.invars[0].aval.dtype == jnp.float32
        and eqn.outvars[0].aval.dtype == jnp.bfloat16):
      n += 1
    inner = in_loop or eqn.primitive.name == "scan"
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          n += _casts_of_head_in_loops(sub, head_shape, inner)
  return n


def test_chunked_head_casts_the_float32_master_once_outside_its_loop():
  """The trainer's float32 master of a bf16 model's head reaches the FP32 head's bf16
  matmuls through one cast taken before the chunk loop (`Transformer.head_operand`), not
  one in every chunk forward and backward; the same log-probs and gradients, bit for bit,
  as with the cast in the loop."""
  cfg = model_config.ModelConfig(family="llama", vocab_size=V, hidden_size=D, num_layers=1,
                                 num_heads=4, num_kv_heads=2, head_dim=12,
                                 intermediate_size=64, param_dtype="bfloat16",
                                 dtype="bfloat16")
  graphdef, params = nnx.split(transformer.create_model(cfg))
  params = jax.tree.map(lambda x: x.astype(jnp.float32), params)  # the trainer's masters
  rng = np.random.default_rng(2)
  tokens = jnp.asarray(rng.integers(0, V, (B, 13)), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(13), (B, 13))
  mask = jnp.ones((B, 13), bool)

  def objective(p):
    logp, _ = logprobs.token_logprobs(nnx.merge(graphdef, p), tokens, pos, mask, 4,
                                      temperature=0.7)
    return jnp.sum(logp * jnp.arange(13)[None, :]), logp

  model = nnx.merge(graphdef, params)
  w, spec = model.head()
  assert w.dtype == jnp.float32 and sorted(w.shape) == sorted((V, D))
  jaxpr = jax.make_jaxpr(jax.grad(objective, has_aux=True))(params).jaxpr
  assert _casts_of_head_in_loops(jaxpr, w.shape) == 0

  # The chunked head itself, with and without the operand taken outside its loop.
  h = jnp.asarray(rng.standard_normal((B, 12, D)), jnp.bfloat16)
  targets = tokens[:, 1:]
  logits_fn = logprobs._logits_fn(model, spec)

  def loss(h_, w_, operand_fn):
    logp, _ = logprobs._chunked_head(logits_fn, h_, w_, targets, 4, 0.7,
                                     operand_fn=operand_fn)
    return jnp.sum(logp * jnp.arange(12)[None, :]), logp

  outs, casts = [], []
  for operand_fn in (model.head_operand, None):
    grad = jax.grad(functools.partial(loss, operand_fn=operand_fn), argnums=(0, 1),
                    has_aux=True)
    outs.append(jax.jit(grad)(h, w))
    casts.append(_casts_of_head_in_loops(jax.make_jaxpr(grad)(h, w).jaxpr, w.shape))
  assert casts[0] == 0 and casts[1] >= 1, casts  # in the loop: the forward's at least
  for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert outs[0][0][1].dtype == jnp.float32  # the master's gradient stays float32


def _in_loop_collectives(compiled_text: str) -> list[tuple[str, str]]:
  """(opcode, shape) of every collective directly inside a while-loop body."""
  from jaxrl_scale.plan import hlo_cost, hlo_text  # pylint: disable=g-import-not-at-top
  comps, _ = hlo_text.parse(compiled_text)
  bodies = {b for insts in comps.values() for i in insts if i.opcode == "while"
            for b in hlo_cost._called(i.attrs, "body")}
  kinds = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute")
  return [(i.opcode, i.shape) for b in bodies for i in comps[b]
          if i.opcode.replace("-start", "") in kinds]


@pytest.mark.parametrize("tp", [1, 2])
def test_sharded_chunked_head_matches_and_reduces_the_weight_gradient_once(tp):
  """Each device's rows through the chunked head under a shard_map, the vocabulary split
  over 'tp' (combined with collectives), against the same head left to the partitioner:
  the same log-probs and gradients (float32, T = 0.7), and no collective of a [.., D]
  array inside the chunk loop (the partitioner's version all-reduces every chunk's weight
  gradient there)."""
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  mesh = jax.make_mesh((8 // tp, tp), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:8])
  rng = np.random.default_rng(3)
  rows, t, d, v = 8, 11, 16, 64  # 11 targets: chunks of 4, the last one padded
  h = jnp.asarray(rng.standard_normal((rows, t, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((v, d)) * 0.3, jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, (rows, t)), jnp.int32)
  g = jnp.asarray(rng.standard_normal((rows, t)), jnp.float32)
  logits_fn = lambda h_, w_: jnp.einsum("BTD,VD->BTV", h_, w_, precision="highest")
  act = NamedSharding(mesh, P("fsdp", None, None))

  def loss(h_, w_, sharded):
    if sharded:
      out = logprobs._sharded_chunked_head(logits_fn, "BTD,VD->BTV", h_, w_, targets, 4,
                                           0.7, act)
      assert out is not None
    else:
      out = logprobs._chunked_head(logits_fn, h_, w_, targets, 4, 0.7,
                                   activation_sharding=act)
    return jnp.sum(out[0] * g), out

  args = (jax.device_put(h, act), jax.device_put(w, NamedSharding(mesh, P("tp", "fsdp"))))
  results, loops = [], []
  for sharded in (False, True):
    step = jax.jit(jax.grad(functools.partial(loss, sharded=sharded), argnums=(0, 1),
                            has_aux=True))
    results.append(jax.device_get(step(*args)))
    loops.append(_in_loop_collectives(step.lower(*args).compile().as_text()))
  ((dh0, dw0), (lp0, top0)), ((dh1, dw1), (lp1, top1)) = results
  np.testing.assert_allclose(lp1, lp0, atol=1e-5)
  np.testing.assert_array_equal(top1, top0)
  np.testing.assert_allclose(dh1, dh0, atol=1e-5)
  np.testing.assert_allclose(dw1, dw0, atol=1e-5)
  assert np.abs(dw0).max() > 1e-2
  has_d = lambda shape: f",{d}]" in shape or f"[{d}," in shape  # noqa: E731
  assert any(has_d(s) for _, s in loops[0]), loops[0]
  assert not any(has_d(s) for _, s in loops[1]), loops[1]


def test_sharded_head_reduces_its_weight_gradient_in_every_micro_batch():
  """The sharded head's weight gradient, summed over micro-batches in a scan as the train
  step does, compiled for 4 v5p chips: reduced inside the loop. Left alone, XLA moved the
  reduce-scatter after the loop, so the loop carried the whole unreduced float32 [V, D]
  gradient on every chip (and the reduction wrote another)."""
  pytest.importorskip("libtpu", reason="pip install -e '.[test]' brings libtpu (jax[tpu])")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.plan import hlo_text  # pylint: disable=g-import-not-at-top
  topo = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu")
  mesh = Mesh(np.array(topo.devices).reshape(-1), ("fsdp",))
  v, d, micro, rows, t = 1024, 256, 2, 4, 64
  logits_fn = lambda h_, w_: layers.fp32_logits(h_, w_, "BTD,VD->BTV", jnp.bfloat16)
  act = NamedSharding(mesh, P("fsdp", None, None))

  def step(w, h_MBTD, targets_MBT):
    def body(acc, xs):
      def loss(w_):
        out = logprobs._sharded_chunked_head(logits_fn, "BTD,VD->BTV", xs[0], w_, xs[1],
                                             16, 1.0, act)
        assert out is not None
        return jnp.sum(out[0])
      return acc + jax.grad(loss)(w), None
    return jax.lax.scan(body, jnp.zeros_like(w), (h_MBTD, targets_MBT))[0]

  # Axis 1 over 'fsdp': w's model dim (as FSDP keeps it), h's and the targets' rows.
  split = NamedSharding(mesh, P(None, "fsdp"))
  args = (jax.ShapeDtypeStruct((v, d), jnp.float32, sharding=split),
          jax.ShapeDtypeStruct((micro, rows, t, d), jnp.bfloat16, sharding=split),
          jax.ShapeDtypeStruct((micro, rows, t), jnp.int32, sharding=split))
  text = jax.jit(step, out_shardings=split).lower(*args).compile().as_text()
  comps, entry = hlo_text.parse(text)
  kinds = ("all-reduce", "reduce-scatter", "all-gather")
  after_loop = [i.shape for i in comps[entry] if i.opcode.replace("-start", "") in kinds]
  assert not after_loop, after_loop
  in_loop = _in_loop_collectives(text)
  assert any(kind in ("reduce-scatter", "all-reduce") and f"f32[{v}," in shape
             for kind, shape in in_loop), in_loop
