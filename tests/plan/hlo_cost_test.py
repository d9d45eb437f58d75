"""Loop-aware FLOPs and bytes from compiled HLO, against hand counts and XLA's own analysis."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_scale.plan import hlo_cost


@pytest.fixture(scope="module")
def tpu_mesh():
  pytest.importorskip("libtpu")
  from jax.experimental import topologies
  topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
  return Mesh(np.array(topo.devices).reshape(4, 1), ("fsdp", "tp"))


def _scan_matmuls(w, x):
  def body(h, w1):
    return jnp.tanh(h @ w1), None
  h, _ = jax.lax.scan(body, x, w)
  return jnp.sum(h.astype(jnp.float32))


@pytest.mark.parametrize("layers", [2, 8])
def test_scan_counts_every_iteration(tpu_mesh, layers):
  rows, d = 512, 512
  w = jax.ShapeDtypeStruct((layers, d, d), jnp.bfloat16, sharding=NamedSharding(tpu_mesh, P()))
  x = jax.ShapeDtypeStruct((rows, d), jnp.bfloat16,
                           sharding=NamedSharding(tpu_mesh, P("fsdp")))
  compiled = jax.jit(jax.grad(_scan_matmuls)).lower(w, x).compile()
  cost = hlo_cost.analyze(compiled.as_text())
  # Per chip: rows/4 rows; forward 1 matmul per layer, backward 2 (dW and dh: the scanned
  # backward body is the same every iteration, so the first layer's dh is computed too).
  per_matmul = 2 * (rows // 4) * d * d
  assert cost.flops == pytest.approx(per_matmul * 3 * layers, rel=1e-6)
  assert cost.unknown_loops == 0
  # XLA's own analysis counts the loop body once: it cannot tell 2 layers from 8.
  once = hlo_cost.analyze(compiled.as_text(), loops=False)
  assert once.flops < cost.flops


def test_matches_xla_without_loops(tpu_mesh):
  def mlp(w1, w2, x):
    return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2))

  w1 = jax.ShapeDtypeStruct((256, 1024), jnp.float32, sharding=NamedSharding(tpu_mesh, P(None, "fsdp")))
  w2 = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=NamedSharding(tpu_mesh, P("fsdp")))
  x = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=NamedSharding(tpu_mesh, P()))
  compiled = jax.jit(jax.grad(mlp, argnums=(0, 1))).lower(w1, w2, x).compile()
  xla = compiled.cost_analysis()
  cost = hlo_cost.analyze(compiled.as_text())
  assert cost.flops == pytest.approx(xla["flops"], rel=0.01)
  # Bytes are an estimate of the same model XLA uses; within a quarter of it.
  assert cost.bytes == pytest.approx(xla["bytes accessed"], rel=0.25)


def test_highest_precision_float32_dot_is_charged_six_passes(tpu_mesh):
  s = NamedSharding(tpu_mesh, P())
  a = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=s)
  hi = jax.jit(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))
  lo = jax.jit(lambda a, b: jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)))
  c_hi = hlo_cost.analyze(hi.lower(a, a).compile().as_text())
  c_lo = hlo_cost.analyze(lo.lower(a, a).compile().as_text())
  assert c_hi.flops == c_lo.flops == 2 * 256**3
  assert c_hi.weighted_flops == 6 * c_lo.weighted_flops


LOOP_HLO = """HloModule m

%body (p: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %p = (s32[], f32[4,4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4,4] get-tuple-element(%p), index=1
  %d = f32[4,4] dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4,4]) tuple(%n, %d)
}

%cond (p: (s32[], f32[4,4])) -> pred[] {
  %p = (s32[], f32[4,4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %c = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4] parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[4,4]) tuple(%z, %a)
  %w = (s32[], f32[4,4]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[4,4] get-tuple-element(%w), index=1
}
"""


def test_parse_reads_trip_count_from_condition():
  text = LOOP_HLO
  cost = hlo_cost.analyze(text)
  assert cost.flops == 7 * 2 * 4 * 4 * 4
  assert cost.unknown_loops == 0


def test_splash_kernels_are_counted(tpu_mesh):
  from jaxrl_scale.models import attention
  sh = NamedSharding(tpu_mesh, P("fsdp", None, None))
  b, t, n, k, h = 4, 1024, 8, 2, 128

  def loss(q, kk, v, m):
    out = attention.causal_attention(q, kk, v, m, impl="splash", sharding=sh)
    return jnp.sum(out.astype(jnp.float32))

  rows = NamedSharding(tpu_mesh, P("fsdp"))
  args = [jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=rows),
          jax.ShapeDtypeStruct((b, t, k, h), jnp.bfloat16, sharding=rows),
          jax.ShapeDtypeStruct((b, t, k, h), jnp.bfloat16, sharding=rows),
          jax.ShapeDtypeStruct((b, t), jnp.bool_, sharding=rows)]
  with jax.set_mesh(tpu_mesh):
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
  cost = hlo_cost.analyze(compiled.as_text())
  # One row per chip, by hand. Forward: 512-wide tiles, 3 of the 4 on or below the causal
  # diagonal, 2 matmuls each. Fused backward: one 1024-wide tile, 5 matmuls.
  fwd = 2 * 3 * (2 * 512 * 512 * h * n)
  bwd = 5 * (2 * 1024 * 1024 * h * n)
  assert cost.flops >= fwd + bwd
  assert cost.flops < (fwd + bwd) * 1.05  # the rest: a few small elementwise dots at most


@pytest.mark.parametrize("heads", [8, 32])
def test_head_projection_written_as_convolution_counted_once(tpu_mesh, heads):
  """On TPU XLA writes 'btd,dnh->btnh' as a convolution whose window spans the padded head
  dimension; counting every window tap overcounted such dots by the number of heads."""
  b, t, d, h = 8, 256, 1024, 128
  x = jax.ShapeDtypeStruct((b, t, d), jnp.bfloat16, sharding=NamedSharding(tpu_mesh, P("fsdp")))
  w = jax.ShapeDtypeStruct((d, heads, h), jnp.bfloat16,
                           sharding=NamedSharding(tpu_mesh, P("fsdp")))

  def loss(x, w):
    return jnp.sum(jnp.einsum("btd,dnh->btnh", x, w).astype(jnp.float32) ** 2)

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile()
  cost = hlo_cost.analyze(compiled.as_text())
  # Per chip (b/4 rows): forward, d(x) and d(w), each 2 * rows * t * d * heads * h.
  one = 2 * (b // 4) * t * d * heads * h
  assert cost.flops == pytest.approx(3 * one, rel=0.02)


def test_trip_count_follows_the_counter_step():
  """XLA's windowed-einsum loops count in steps of 2: `i < 8` from 0 runs 4 times."""
  text = LOOP_HLO.replace("constant(1)", "constant(2)").replace("constant(7)", "constant(8)")
  assert hlo_cost.analyze(text).flops == 4 * 2 * 4 * 4 * 4
  # Started at 3 in steps of 2 below 8: 3, 5, 7.
  text = text.replace("%z = s32[] constant(0)", "%z = s32[] constant(3)")
  assert hlo_cost.analyze(text).flops == 3 * 2 * 4 * 4 * 4


KERNELS_HLO = """HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: f32[64,64]) -> (f32[64,64], f32[64,64]) {
  %a = f32[64,64] parameter(0)
  %d = f32[64,64] dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %e = f32[64,64] exponential(%a)
  %r = f32[64,64] all-reduce(%e), replica_groups={}, to_apply=%add
  ROOT %t = (f32[64,64], f32[64,64]) tuple(%d, %r)
}
"""


def test_kernel_seconds_sum_each_kernels_own_roofline():
  """A compute-bound matmul and a memory-bound elementwise kernel: their times add (the
  whole-program max(FLOPs / peak, bytes / bandwidth) hides the second); the all-reduce is
  communication and stays out; a loop body counts once per iteration."""
  peak, bandwidth = 1e6, 1e9
  cost = hlo_cost.analyze(KERNELS_HLO, rates=(peak, bandwidth))
  dot_flops, exp_bytes = 2 * 64**3, 2 * 64 * 64 * 4
  assert cost.kernel_seconds == pytest.approx(dot_flops / peak + exp_bytes / bandwidth,
                                              rel=1e-9)
  whole = max(cost.weighted_flops / peak, cost.bytes / bandwidth)
  assert cost.kernel_seconds > whole
  assert hlo_cost.analyze(KERNELS_HLO).kernel_seconds == 0  # no rates, no times
  # The all-reduce's array is what crosses the interconnect; nothing else is a collective.
  assert cost.collective_bytes == 64 * 64 * 4
  assert hlo_cost.analyze(LOOP_HLO).collective_bytes == 0
  # LOOP_HLO: 7 iterations of a 4x4 matmul (compute-bound here) and the counter's add.
  loop = hlo_cost.analyze(LOOP_HLO, rates=(peak, bandwidth))
  assert loop.kernel_seconds == pytest.approx(7 * 2 * 4**3 / peak, rel=1e-3)


FAMILIES_HLO = """HloModule m

%body (p: (s32[], f32[64,64])) -> (s32[], f32[64,64]) {
  %p = (s32[], f32[64,64]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[64,64] get-tuple-element(%p), index=1
  %d = f32[64,64] dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %e = f32[64,64] exponential(%d)
  %c = f32[64,64] copy(%e)
  %f = f32[64,64] custom-call(%c), custom_call_target="__cudnn$fmhaSoftmax"
  %g = f32[64,64] custom-call(%f), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "paged_decode_attention"}
  %h = f32[64,64] custom-call(%g), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "rms_norm"}
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[64,64]) tuple(%n, %h)
}

%cond (p: (s32[], f32[64,64])) -> pred[] {
  %p = (s32[], f32[64,64]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %k = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64] parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[64,64]) tuple(%z, %a)
  %w = (s32[], f32[64,64]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[64,64] get-tuple-element(%w), index=1
}
"""


def test_kernel_seconds_split_by_family():
  """Each kernel's roofline time goes to its family, loop iterations included: the dot to
  matmul; cuDNN's attention and the Triton paged kernel (by the kernel name it carries) to
  attention; the copy to copy; the exponential, the loop counter and a Triton kernel of
  another name to other. The families add up to the kernel-by-kernel bound."""
  peak, bandwidth = 1e6, 1e9
  cost = hlo_cost.analyze(FAMILIES_HLO, rates=(peak, bandwidth))
  move = 2 * 64 * 64 * 4 / bandwidth  # read and write one f32[64, 64]
  counter = 3 * 4 / bandwidth  # the s32 add: two operands read, one written
  want = {"matmul": 3 * 2 * 64**3 / peak, "attention": 3 * 2 * move, "copy": 3 * move,
          "other": 3 * (2 * move + counter)}
  assert set(cost.family_seconds) == set(want) == set(hlo_cost.FAMILIES)
  for f, t in want.items():
    assert cost.family_seconds[f] == pytest.approx(t, rel=1e-9), f
  assert sum(cost.family_seconds.values()) == pytest.approx(cost.kernel_seconds, rel=1e-12)
  assert hlo_cost.analyze(FAMILIES_HLO).family_seconds == {}  # no rates, no times


COND_HLO = """HloModule m

%costly (p: f32[64,64]) -> f32[64,64] {
  %p = f32[64,64] parameter(0)
  ROOT %d = f32[64,64] dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%cheap (p: f32[64,64]) -> f32[64,64] {
  %p = f32[64,64] parameter(0)
  ROOT %c = f32[64,64] copy(%p)
}

ENTRY %main (a: f32[64,64], b: pred[], i: s32[]) -> (f32[64,64], f32[64,64]) {
  %a = f32[64,64] parameter(0)
  %b = pred[] parameter(1)
  %i = s32[] parameter(2)
  %x = f32[64,64] conditional(%b, %a, %a), true_computation=%costly, false_computation=%cheap
  %y = f32[64,64] conditional(%i, %a, %a), branch_computations={%cheap, %costly}
  ROOT %t = (f32[64,64], f32[64,64]) tuple(%x, %y)
}
"""


def test_a_conditional_is_charged_its_cheapest_branch():
  """Both ways XLA prints a conditional (a predicate with true / false computations, an
  index with branch computations): each runs one branch, and the bound charges the
  cheaper (a copy here, not the matmul). Summing the branches charged the matmul; the
  predicate form was charged nothing."""
  peak, bandwidth = 1e6, 1e9
  cost = hlo_cost.analyze(COND_HLO, rates=(peak, bandwidth))
  copy_bytes = 2 * 64 * 64 * 4
  assert cost.flops == 0
  assert cost.bytes == 2 * copy_bytes
  assert cost.kernel_seconds == pytest.approx(2 * copy_bytes / bandwidth, rel=1e-9)
  # Without rates the branches are compared by bytes: the same choice.
  assert hlo_cost.analyze(COND_HLO).bytes == 2 * copy_bytes


def test_in_place_cache_writes_count_the_update(tpu_mesh):
  """A decode loop writes one token per row into a loop-carried cache: the bytes moved are
  the tokens written, not the whole cache every step."""
  layers, rows, slots, width, steps = 4, 8, 2048, 256, 16
  s = NamedSharding(tpu_mesh, P())
  cache = jax.ShapeDtypeStruct((layers, rows, slots, width), jnp.bfloat16, sharding=s)
  idx = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=s)

  def decode(cache, idx):
    def step(i, c):
      new = jnp.full((layers, rows, width), i, jnp.bfloat16)
      return c.at[:, jnp.arange(rows), idx + i].set(new)
    return jax.lax.fori_loop(0, steps, step, cache)

  compiled = jax.jit(decode, donate_argnums=0).lower(cache, idx).compile()
  cost = hlo_cost.analyze(compiled.as_text())
  cache_bytes = layers * rows * slots * width * 2
  # The compiler may copy the cache in and out once (a layout change: 4 x cache_bytes);
  # counting every step's scatter as a rewrite of the whole cache would add 2 x 16 x it.
  assert cost.bytes < 6 * cache_bytes


def test_ragged_paged_kernel_is_charged_one_layers_pool(tpu_mesh):
  """The decode kernel gets the whole pool [L*P, C, 2K, H] as an operand but reads one
  layer's pages: it is charged that layer's share (every slot at the pool's average length)
  and QK^T + PV over those positions, by hand."""
  import functools

  from jaxrl_scale.models import paged_attention
  mesh = Mesh(np.array(tpu_mesh.devices).reshape(4, 1), ("data", "tp"))
  rows, n, k, h, page, width, pages, layers = 16, 8, 2, 128, 16, 8, 40, 4
  sh = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
  args = (jax.ShapeDtypeStruct((rows, 1, n, h), jnp.bfloat16, sharding=sh("data")),
          jax.ShapeDtypeStruct((rows, 1, k, h), jnp.bfloat16, sharding=sh("data")),
          jax.ShapeDtypeStruct((rows, 1, k, h), jnp.bfloat16, sharding=sh("data")),
          jax.ShapeDtypeStruct((layers, 4, pages + 1, page, 2 * k, h), jnp.bfloat16,
                               sharding=sh(None, "data")),
          jax.ShapeDtypeStruct((), jnp.int32, sharding=sh()),
          jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=sh("data")),
          jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=sh("data")),
          jax.ShapeDtypeStruct((rows,), jnp.bool_, sharding=sh("data")))
  fn = functools.partial(paged_attention.paged_attention, view_pages=width, mesh=mesh)
  with jax.set_mesh(mesh):
    text = jax.jit(fn, donate_argnums=(3,)).lower(*args).compile().as_text()
  assert "ragged_paged_attention_kernel" in text
  layer_pool = (pages + 1) * page * 2 * k * h * 2  # one layer's pages on one chip, bytes
  cost = hlo_cost.analyze(text, paged_layers=layers)
  assert cost.flops == pytest.approx(4 * n * h * (pages + 1) * page, rel=1e-6)
  assert layer_pool <= cost.bytes < layer_pool * 1.2
  # Charging the whole operand instead would count every layer's pages on every call.
  assert hlo_cost.analyze(text).bytes >= layers * layer_pool


@pytest.mark.slow  # 23 s on 2 cores; the one check of megablox rows under expert parallelism (-m slow)
def test_megablox_under_expert_parallelism_is_charged_its_experts_rows():
  """The MoE layer at fsdp 2 x expert 2 (v5p:2x2x1, libtpu): 1024 tokens, top-2 of 4
  experts, so a device holds 256 tokens (512 pairs), its expert group gathers 1024 rows and
  its 2 experts get 512 of them when the router balances. Each of the 7 kernels (3 forward
  projections, the down projection's input gradient, 3 grouped weight gradients) does
  2 x 512 x D x F by hand; megablox's own estimate counts all 1024 gathered rows."""
  import os
  import re

  from jax.sharding import AxisType

  from jaxrl_scale.models import moe
  from jaxrl_scale.parallel import mesh as mesh_lib
  pytest.importorskip("libtpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  topo = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu")
  mesh = jax.make_mesh((2, 2), ("fsdp", mesh_lib.EXPERT_AXIS), axis_types=(AxisType.Auto,) * 2,
                       devices=topo.devices)
  e, d, f, n, k = 4, 256, 128, 1024, 2
  act = NamedSharding(mesh, P(("fsdp", mesh_lib.EXPERT_AXIS), None, None))
  params = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((e, d, f), (e, d, f), (e, f, d))]
  x = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((n, k), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((n, k), jnp.int32)

  def grads(x_ND, weights_NK, experts_NK, params):
    def loss(params):
      local = moe._local_experts(act, n, params)  # pylint: disable=protected-access
      return jnp.sum(local(x_ND, weights_NK, experts_NK, *params).astype(jnp.float32) ** 2)
    return jax.grad(loss)(params)

  with jax.set_mesh(mesh):
    text = jax.jit(grads).lower(x, w, ids, params).compile().as_text()
  assert len(re.findall(r"%t?gmm[.\d]* = ", text)) == 7
  rows = n * k // 4  # a device's own pairs: its experts' share of the group's gathered rows
  expected = 7 * 2 * rows * d * f
  assert hlo_cost.analyze(text, expert_shards=2).flops == pytest.approx(expected, rel=0.02)
  # Megablox's estimate as it stands: every gathered row, twice the experts' work.
  assert hlo_cost.analyze(text).flops == pytest.approx(2 * expected, rel=0.02)
