"""Mixture-of-experts MLP: top-k routing with a float32 router, dropless grouped matmuls.

Shapes: N tokens (B * T flattened), D hidden, E experts, K experts per token (top-k),
F each expert's hidden size.

Every token goes to its K experts, however unbalanced the routing (dropless: no capacity
factor, so no token is silently skipped, and the trainer and sampler compute the same
function whatever the batch). The N * K (token, expert) pairs are sorted by expert and the
experts run as grouped matmuls over the sorted rows (`jax.lax.ragged_dot`: each expert's
weights multiply only its own contiguous group). GPU lowers it to XLA's ragged dot. On TPU
the shard_map path runs the Pallas megablox kernel instead (`grouped_matmul`: XLA's TPU
ragged dot computes the weight gradient dense over the experts).

On CPU JAX lowers ragged_dot to a dense product masked per expert: every one of the N * K
sorted rows times every expert, E times the FLOPs (measured: 21x one dense matmul at
M=4096, D=256, F=512, E=16), plus the sort and gathers. There the experts run without
sorting instead (`_dense_experts`): every token through every expert as three plain
matmuls over the E * F concatenated hidden units, each expert's hidden units scaled by the
token's gate for it (0 for the experts it did not choose). That is E / K times the active
FLOPs, K times fewer than the masked ragged_dot, and the same function: unchosen experts
add exactly zero and get exactly zero gradient. Measured (tiny_qwen3_moe's D=64, E=8,
F=32, K=2, 3584 tokens, fwd+bwd of one layer on one CPU device): 93 ms with ragged_dot,
25 ms dense.

Logical axes: 'expert' E (split over the mesh's expert axis when it has one:
`_local_experts`), 'embed' D, 'moe_mlp' F.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from jaxrl_scale.models import attention, grouped_matmul, layers
from jaxrl_scale.models.config import ModelConfig

# The mesh axis that splits the experts (`parallel.mesh.EXPERT_AXIS`; models sit below
# parallel, so the name is repeated here).
_EXPERT = "expert"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterStats:
  """Sums over the real (mask True) tokens of the sparse layers, for the load-balancing loss.

  chosen_E: how many (token, slot) pairs picked each expert (no gradient).
  prob_E: the routing probabilities (softmax of the router logits), summed (float32).
  tokens: real tokens counted, once per sparse layer.
  """

  chosen_E: jax.Array
  prob_E: jax.Array
  tokens: jax.Array
  # Routing replay (`MoE.apply` given recorded choices): of the `compared` recorded
  # (token, slot) choices at real tokens, how many the router's own top-k lacks.
  mismatch: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((), jnp.float32))
  compared: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((), jnp.float32))

  @staticmethod
  def zeros(num_experts: int) -> RouterStats:
    z = jnp.zeros((num_experts,), jnp.float32)
    s = jnp.zeros((), jnp.float32)
    return RouterStats(chosen_E=z, prob_E=z, tokens=s, mismatch=s, compared=s)

  def __add__(self, other: RouterStats) -> RouterStats:
    return jax.tree.map(jnp.add, self, other)

  def sum_layers(self) -> RouterStats:
    """Stats stacked over a leading layer axis, summed over it."""
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), self)

  def load_balancing_loss(self) -> jax.Array:
    """Switch Transformer's loss, E * sum_e f_e * P_e with f_e the fraction of routed
    (token, slot) pairs per token that chose e and P_e the mean routing probability of e,
    over every sparse layer's real tokens pooled (as transformers' `load_balancing_loss_func`
    pools the layers). 0 without real tokens. Its minimum, K, is perfect balance."""
    n = jnp.maximum(self.tokens, 1.0)
    e = self.chosen_E.shape[-1]
    return e * jnp.sum((self.chosen_E / n) * (self.prob_E / n))

  def routing_mismatch(self) -> jax.Array:
    """The fraction of recorded (token, layer, slot) expert choices that the router's own
    top-k would not have made (0 when nothing was compared)."""
    return self.mismatch / jnp.maximum(self.compared, 1.0)


class MoE(nnx.Module):
  """The sparse MLP: sum over the token's top-k experts of weight * SwiGLU_expert(x), plus
  a shared dense SwiGLU when cfg.shared_expert_size > 0."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    e, d, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    pd = jnp.dtype(cfg.param_dtype)
    init = nnx.initializers.normal(stddev=0.02)
    # Router [D, E]; small, so kept whole on every chip.
    self.router = layers.param(init(rngs.params(), (d, e), pd), ("embed", None),
                               float32_grad=True)  # scored in float32
    self.gate_proj = layers.param(init(rngs.params(), (e, d, f), pd),
                                  ("expert", "embed", "moe_mlp"))
    self.up_proj = layers.param(init(rngs.params(), (e, d, f), pd),
                                ("expert", "embed", "moe_mlp"))
    self.down_proj = layers.param(init(rngs.params(), (e, f, d), pd),
                                  ("expert", "moe_mlp", "embed"))
    self.shared_expert = (layers.MLP(cfg, rngs=rngs, intermediate_size=cfg.shared_expert_size)
                          if cfg.shared_expert_size else None)
    self.top_k = cfg.experts_per_token
    self.scoring = cfg.router_scoring
    self.norm_topk_prob = cfg.norm_topk_prob
    self.param_dtype = pd
    self.dtype = jnp.dtype(cfg.dtype)

  def route(self, x_ND: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(weights_NK in cfg.dtype, experts_NK int32, probs_NE float32) of N tokens.

    The router runs in float32 (HIGHEST precision): a bf16 router can flip near-tied top-k
    choices between two programs that round differently, and the trainer then scores
    different experts than the sampler ran.
    """
    logits_NE, probs_NE = self.scores(x_ND)
    experts_NK = self.top_k_experts(logits_NE, probs_NE)
    return self.gates(logits_NE, probs_NE, experts_NK), experts_NK, probs_NE

  def scores(self, x_ND: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The router's (logits_NE, probs_NE = softmax(logits)), float32."""
    w_DE = layers.held(self.router[...], self.param_dtype).astype(jnp.float32)
    logits_NE = jnp.dot(x_ND.astype(jnp.float32), w_DE, precision=jax.lax.Precision.HIGHEST)
    return logits_NE, jax.nn.softmax(logits_NE, axis=-1)

  def top_k_experts(self, logits_NE: jax.Array, probs_NE: jax.Array) -> jax.Array:
    """The router's own choice, experts_NK int32 (softmax: top-k of the probabilities;
    sigmoid: of the logits), highest score first."""
    scores_NE = probs_NE if self.scoring == "softmax" else logits_NE
    return jax.lax.top_k(scores_NE, self.top_k)[1].astype(jnp.int32)

  def gates(self, logits_NE: jax.Array, probs_NE: jax.Array, experts_NK: jax.Array,
            ) -> jax.Array:
    """weights_NK (cfg.dtype) of the experts `experts_NK`, whoever chose them: gathered from
    the router's scores, so the gradient reaches the router through exactly these gates.
    For the router's own top-k the gathered values are the top-k values themselves."""
    if self.scoring == "softmax":
      weights_NK = jnp.take_along_axis(probs_NE, experts_NK, axis=-1)
      if self.norm_topk_prob:
        weights_NK = weights_NK / jnp.sum(weights_NK, axis=-1, keepdims=True)
    else:  # sigmoid (Llama 4): the chosen experts' logits squashed independently
      weights_NK = jax.nn.sigmoid(jnp.take_along_axis(logits_NE, experts_NK, axis=-1))
    return weights_NK.astype(self.dtype)

  def __call__(self, x_BTD: jax.Array, mask_BT: jax.Array | None = None,
               sharding: jax.sharding.NamedSharding | None = None,
               ) -> tuple[jax.Array, RouterStats]:
    """(y_BTD, stats); see `apply`."""
    y_BTD, stats, _ = self.apply(x_BTD, mask_BT, sharding)
    return y_BTD, stats

  def apply(self, x_BTD: jax.Array, mask_BT: jax.Array | None = None,
            sharding: jax.sharding.NamedSharding | None = None,
            recorded_BTK: jax.Array | None = None, recorded_BT: jax.Array | None = None,
            replay: bool = False) -> tuple[jax.Array, RouterStats, jax.Array]:
    """(y_BTD, stats, experts_BTK int32: the experts each token went to).

    `mask_BT` (True at real tokens) only limits what the stats count: padding tokens are
    routed and computed like any other (their outputs are ignored).

    `sharding`: where the [B, T, D] activations live (rows over a data axis). Given, each
    shard of rows sorts and runs its own tokens (`_local_experts`); without it the sort
    spans the whole batch, which the compiler may carry out by gathering every token on
    every chip.

    Routing replay: `recorded_BTK` (any int dtype) are expert choices another program made
    (the sampler's), valid where `recorded_BT` (None: everywhere). The stats count how many
    of them at real tokens the router's own top-k lacks (`RouterStats.routing_mismatch`).
    With `replay` the tokens go to the recorded experts instead of the router's own
    (elsewhere to its own), weighted by this router's gates for them (`gates`).
    """
    b, t, d = x_BTD.shape
    n = b * t
    x_ND = x_BTD.reshape(n, d).astype(self.dtype)
    logits_NE, probs_NE = self.scores(x_ND)
    experts_NK = self.top_k_experts(logits_NE, probs_NE)
    real_N = (jnp.ones((n,), jnp.float32) if mask_BT is None
              else mask_BT.reshape(n).astype(jnp.float32))
    mismatch = compared = jnp.zeros((), jnp.float32)
    if recorded_BTK is not None:
      rec_NK = recorded_BTK.reshape(n, self.top_k).astype(jnp.int32)
      has_N = (jnp.ones((n,), jnp.bool_) if recorded_BT is None
               else recorded_BT.reshape(n).astype(jnp.bool_))
      # A slot mismatches when its recorded expert is not among the router's own K (the
      # order within the K does not change the output).
      miss_NK = ~jnp.any(rec_NK[:, :, None] == experts_NK[:, None, :], axis=-1)
      counted_N = real_N * has_N.astype(jnp.float32)
      mismatch = jnp.sum(miss_NK.astype(jnp.float32) * counted_N[:, None])
      compared = jnp.sum(counted_N) * self.top_k
      if replay:
        experts_NK = jnp.where(has_N[:, None], rec_NK, experts_NK)
    weights_NK = self.gates(logits_NE, probs_NE, experts_NK)
    e = probs_NE.shape[-1]
    params = (self._weight(self.gate_proj), self._weight(self.up_proj),
              self._weight(self.down_proj))
    local = _local_experts(sharding, b, params)
    if local is None:
      y_ND = _experts(x_ND, weights_NK, experts_NK, *params,
                      impl=_unsharded_impl(attention.platform(sharding), n))
    else:
      y_ND = local(x_ND, weights_NK, experts_NK, *params)
    if self.shared_expert is not None:
      y_ND = y_ND + self.shared_expert(x_ND[None], sharding)[0]

    # A segment sum, not a one-hot: [N, K, E] floats would be 268 MB at 64k tokens, top-8
    # of 128 experts.
    chosen_E = jax.ops.segment_sum(jnp.repeat(real_N, self.top_k), experts_NK.reshape(-1),
                                   num_segments=e)
    stats = RouterStats(
        chosen_E=jax.lax.stop_gradient(chosen_E),
        prob_E=real_N @ probs_NE,
        tokens=jnp.sum(real_N),
        mismatch=jax.lax.stop_gradient(mismatch),
        compared=jax.lax.stop_gradient(compared))
    return (y_ND.reshape(b, t, d).astype(x_BTD.dtype), stats,
            experts_NK.reshape(b, t, self.top_k))

  def _weight(self, w: nnx.Param) -> jax.Array:
    """An expert weight as the model computes with it, in cfg.dtype."""
    w_EXY = w[...]
    if self.dtype != self.param_dtype:  # the rule of `layers.Einsum`
      w_EXY = layers.held(w_EXY, self.param_dtype)
    return w_EXY.astype(self.dtype)


def _experts(x_ND: jax.Array, weights_NK: jax.Array, experts_NK: jax.Array,
             gate_EDF: jax.Array, up_EDF: jax.Array, down_EFD: jax.Array,
             first: jax.Array | None = None, impl: str = "ragged") -> jax.Array:
  """sum_k weights_NK * SwiGLU_{experts_NK}(x_ND) as grouped matmuls: [N, D].

  `first` (expert parallelism): the weights are experts first .. first + E - 1 of a larger
  set; only the (token, slot) pairs routed to them count, the others add zero.
  `impl`: the grouped matmul's kernel (`grouped_matmul.IMPLS`), or "dense": no grouped
  matmul, every expert on every token (`_dense_experts`, the CPU path).
  """
  if impl == "dense":
    return _dense_experts(x_ND, weights_NK, experts_NK, gate_EDF, up_EDF, down_EFD, first)
  if impl == "einsum":
    return _einsum_experts(x_ND, weights_NK, experts_NK, gate_EDF, up_EDF, down_EFD, first)
  n, k = experts_NK.shape
  e = gate_EDF.shape[0]
  experts_M = experts_NK.reshape(n * k)
  mine_M = None
  if first is not None:
    experts_M = experts_M - first
    mine_M = (experts_M >= 0) & (experts_M < e)
    # Other shards' pairs sort after this shard's E groups, outside every group.
    experts_M = jnp.where(mine_M, experts_M, e)
  # Sort the N * K (token, expert) pairs by expert; group g of the sorted rows is expert g.
  order_M = jnp.argsort(experts_M, stable=True)
  group_sizes_E = jnp.bincount(experts_M, length=e).astype(jnp.int32)  # drops the id e
  x_MD = x_ND[order_M // k]
  dot = lambda a, w: grouped_matmul.grouped_matmul(a, w, group_sizes_E,  # noqa: E731
                                                   impl=impl)
  y_MD = dot(jax.nn.silu(dot(x_MD, gate_EDF)) * dot(x_MD, up_EDF), down_EFD)
  # Back to (token, slot) order: a gather by the inverse permutation (its gradient is a
  # gather too, where a scatter's would be a scatter-add).
  y_NKD = y_MD[jnp.argsort(order_M)].reshape(n, k, -1)
  if mine_M is not None:
    # ragged_dot leaves rows past the groups zero on CPU; a select (not a product: a
    # kernel may leave those rows unwritten) makes that hold everywhere.
    y_NKD = jnp.where(mine_M.reshape(n, k, 1), y_NKD, jnp.zeros((), y_NKD.dtype))
  return jnp.sum(y_NKD * weights_NK[:, :, None], axis=1)


# At most this many tokens, an unsharded MoE layer off CPU (the sampler's decode) runs every
# expert on every token as einsums (`_einsum_experts`). Their N FLOPs per weight byte stay
# under a TPU's or GPU's ridge point (v5p 459 TFLOP/s over 2.76 TB/s: 166; H100 bf16 ~295),
# so the step stays bound by reading the weights, which the einsums read in place, where
# ragged_dot, a custom call on TPU, first copied each layer's expert weights out of the
# stacked arrays (docs/models.md: Scout's decode).
EINSUM_MAX_TOKENS = 128


def _unsharded_impl(platform: str, tokens: int) -> str:
  """The experts' kernel of an MoE layer whose activations carry no sharding."""
  if platform == "cpu":
    return "dense"
  return "einsum" if tokens <= EINSUM_MAX_TOKENS else "ragged"


def _einsum_experts(x_ND: jax.Array, weights_NK: jax.Array, experts_NK: jax.Array,
                    gate_EDF: jax.Array, up_EDF: jax.Array, down_EFD: jax.Array,
                    first: jax.Array | None = None) -> jax.Array:
  """`_experts` for a few tokens: every token through all E experts as einsums over the
  expert axis (no sort, no transposed weights), then each (token, slot) pair's expert
  output picked and summed as `_experts` sums them (pairs routed outside experts
  first .. first + E - 1 add zero). Costs E / K times the active FLOPs."""
  e = gate_EDF.shape[0]
  dot = lambda spec, a, b: jnp.einsum(  # noqa: E731
      spec, a, b, preferred_element_type=jnp.float32).astype(x_ND.dtype)
  h_NEF = jax.nn.silu(dot("nd,edf->nef", x_ND, gate_EDF)) * dot("nd,edf->nef", x_ND, up_EDF)
  y_NED = dot("nef,efd->ned", h_NEF, down_EFD)
  ids_NK = experts_NK if first is None else experts_NK - first
  mine_NK = (ids_NK >= 0) & (ids_NK < e)
  y_NKD = jnp.take_along_axis(y_NED, jnp.clip(ids_NK, 0, e - 1)[:, :, None], axis=1)
  y_NKD = jnp.where(mine_NK[:, :, None], y_NKD, jnp.zeros((), y_NKD.dtype))
  return jnp.sum(y_NKD * weights_NK[:, :, None], axis=1)


def _dense_experts(x_ND: jax.Array, weights_NK: jax.Array, experts_NK: jax.Array,
                   gate_EDF: jax.Array, up_EDF: jax.Array, down_EFD: jax.Array,
                   first: jax.Array | None = None) -> jax.Array:
  """`_experts` without sorting: every token through all E experts, weighted by a [N, E]
  gate that is weights_NK at the token's chosen experts and 0 elsewhere (and for pairs
  routed outside experts first .. first + E - 1). A multiply by an exact 0 makes an
  unchosen expert add nothing and take no gradient, so this is the grouped path's function;
  only the rounding order differs (the gate scales the hidden units before the down
  projection, not its output). Costs E / K times the active FLOPs: for CPU, whose
  ragged_dot costs E times (module docstring)."""
  e, d, f = gate_EDF.shape
  ids_NK = experts_NK if first is None else experts_NK - first
  # Each expert appears at most once in a token's K, so this sum only places each gate.
  onehot_NKE = (ids_NK[:, :, None] == jnp.arange(e, dtype=ids_NK.dtype)[None, None]).astype(
      weights_NK.dtype)
  gates_NE = jnp.sum(weights_NK[:, :, None] * onehot_NKE, axis=1)
  # [E, D, F] -> [D, E * F]: plain 2-D matmuls, which XLA's CPU backend runs far faster
  # than the batched einsum over the expert axis (measured 25 vs 45 ms fwd+bwd).
  gate_DH = gate_EDF.transpose(1, 0, 2).reshape(d, e * f)
  up_DH = up_EDF.transpose(1, 0, 2).reshape(d, e * f)
  h_NH = jax.nn.silu(x_ND @ gate_DH) * (x_ND @ up_DH) * jnp.repeat(gates_NE, f, axis=1)
  return h_NH @ down_EFD.reshape(e * f, d)


def _axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry as a tuple of mesh axes."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _local_experts(sharding: jax.sharding.NamedSharding | None, rows: int,
                   params: tuple[jax.Array, ...], impl: str | None = None):
  """`_experts` run by every shard of rows on its own tokens (a shard_map), or None when
  `sharding` splits no rows (or not evenly) and the mesh has no expert axis.

  Inside, the expert weights are whole on their model dim (the all-gather FSDP does for
  any weight) and split on F over 'tp' where it divides, the down projection's partial
  sums then added over 'tp'.

  With an expert axis of size ep (`parallel.mesh.EXPERT_AXIS`, dividing E) each device
  holds E / ep experts, and the tokens go to them: the devices of one expert group (the ep
  devices that differ only in their expert coordinate) all-gather their tokens, each runs
  its own experts over every token of the group, and a reduce-scatter adds the ep partial
  outputs and hands each device its own rows back. When the rows are not split over the
  expert axis (the sampler's slots) every device already has the group's tokens: no
  gather, and a psum instead of the reduce-scatter.

  Why a gather and not an all-to-all of the (token, expert) pairs: dropless routing with
  static shapes sizes either exchange for the worst case (all of a group's pairs at one
  shard), so both feed the grouped matmul ep * N * K rows. Per device the gather receives
  (ep - 1) * N * D values (and the scatter as many), the all-to-all about
  (ep - 1) / ep * N * K * D: the gather moves fewer bytes while ep < K (Qwen3-30B-A3B, K = 8,
  ep 2: N * D against 4 * N * D) and needs no send/receive counts; with K = 1 (the Scout
  preset, ep 4) an all-to-all would move 4x fewer bytes (not built). The pairs of other
  shards sort past this shard's groups and stay zero.

  `impl` (None: by platform): the experts' kernel; "dense" on CPU (`_dense_experts`), else
  `grouped_matmul.auto_impl`: megablox on TPU, where it runs per device as Pallas kernels
  must.
  """
  if sharding is None or not sharding.spec:
    return None
  mesh = sharding.mesh
  e, f = params[0].shape[0], params[0].shape[-1]
  ep = mesh.shape.get(_EXPERT, 1)
  expert = _EXPERT if ep > 1 and e % ep == 0 else None
  row_axes = _axes(sharding.spec[0])
  shards = 1
  for a in row_axes:
    shards *= mesh.shape[a]
  if rows % shards:
    row_axes, shards = (), 1
  if expert is None and shards == 1:
    return None
  tp = "tp" if "tp" in mesh.shape and "tp" not in row_axes and f % mesh.shape["tp"] == 0 \
      and mesh.shape["tp"] > 1 else None
  rows_spec = PartitionSpec(row_axes or None, None)
  if impl is None and attention.platform(sharding) == "cpu":
    impl = "dense"
  elif impl is None:
    f_local = f // mesh.shape["tp"] if tp else f
    impl = grouped_matmul.auto_impl(attention.on_tpu(mesh), params[0].shape[1], f_local)
  gathered = expert is not None and expert in row_axes

  def body(x_ND, weights_NK, experts_NK, gate_EDF, up_EDF, down_EFD):
    first = None
    if expert is not None:
      first = jax.lax.axis_index(expert) * gate_EDF.shape[0]
    if gathered:
      x_ND, weights_NK, experts_NK = (jax.lax.all_gather(a, expert, axis=0, tiled=True)
                                      for a in (x_ND, weights_NK, experts_NK))
    y_ND = _experts(x_ND, weights_NK, experts_NK, gate_EDF, up_EDF, down_EFD, first, impl)
    if gathered:
      y_ND = jax.lax.psum_scatter(y_ND, expert, scatter_dimension=0, tiled=True)
    elif expert is not None:
      y_ND = jax.lax.psum(y_ND, expert)
    return y_ND if tp is None else jax.lax.psum(y_ND, tp)

  return jax.shard_map(
      body, mesh=mesh,
      in_specs=(rows_spec, rows_spec, rows_spec, PartitionSpec(expert, None, tp),
                PartitionSpec(expert, None, tp), PartitionSpec(expert, tp, None)),
      out_specs=rows_spec, check_vma=False)


def decode_sharding(mesh: jax.sharding.Mesh | None, rows: int
                    ) -> jax.sharding.NamedSharding | None:
  """The activation sharding that a decode step's [B, 1, D] rows give the MoE layers: rows
  over 'data' as the sampler lays its slots out, but only on a mesh with an expert axis
  (elsewhere None, the compiler's choice, as before expert parallelism)."""
  if mesh is None or mesh.shape.get(_EXPERT, 1) == 1:
    return None
  data = mesh.shape.get("data", 1)
  axis = "data" if data > 1 and rows % data == 0 else None
  return jax.sharding.NamedSharding(mesh, PartitionSpec(axis, None, None))
