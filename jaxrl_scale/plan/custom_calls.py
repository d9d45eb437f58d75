"""What XLA's opaque kernels cost: FLOPs (and bytes) of custom calls, for `hlo_cost`.

XLA counts no work inside a custom call. These read a call's FLOPs from its own cost
estimate where it carries one (megablox), else from its shapes: cuBLAS matmuls, cuDNN's
fused attention, the splash attention kernels, and the paged decode attention kernels (the
TPU ragged one and our Triton one), which are also charged the bytes of the one layer's
pool they read (`ragged_paged`).
"""

from __future__ import annotations

import math
import re

from jaxrl_scale.plan.hlo_text import _DTYPE_BYTES, _Inst, _arrays, _dims, _nbytes


def target(inst: _Inst) -> str:
  m = re.search(r'custom_call_target="([^"]*)"', inst.attrs)
  return m.group(1) if m else ""


def _cublas_flops(inst: _Inst, shapes: dict[str, str]) -> float:
  """2 x multiply-adds of a cuBLAS matmul custom call (XLA:GPU's __cublas$gemm and
  __cublas$lt$matmul), from its result shape and contracting dimensions."""
  if not target(inst).startswith("__cublas$"):
    return 0.0
  m = re.search(r'"lhs_contracting_dimensions":\[([0-9",]*)\]', inst.attrs)
  lhs = _dims(shapes.get(inst.operands[0], "")) if inst.operands else ()
  if not m or not lhs:
    return 0.0
  contract = [int(x) for x in re.findall(r"\d+", m.group(1))]
  return 2.0 * math.prod(_dims(inst.shape)) * math.prod(lhs[i] for i in contract if i < len(lhs))


def _cudnn_attention_flops(inst: _Inst, shapes: dict[str, str]) -> float:
  """FLOPs of cuDNN's fused attention (__cudnn$fmha...): QK^T and PV over its score tensor
  [B, N, Tq, Tk] (`intermediate_tensor_shape`) with q's head dim, halved under a causal
  mask (cuDNN skips the tiles above the diagonal); the backward recomputes QK^T and runs
  dP, dS K, dS^T Q and P^T dO: five matmuls, 2.5 forwards."""
  name = target(inst)
  if not name.startswith("__cudnn$fmha"):
    return 0.0
  m = re.search(r'"intermediate_tensor_shape":\s*\{[^{}]*?"dimensions":\s*\[([0-9", ]*)\]',
                inst.attrs)
  q = _dims(shapes.get(inst.operands[0], "")) if inst.operands else ()
  if not m or not q:
    return 0.0
  scores = math.prod(int(x) for x in re.findall(r"\d+", m.group(1)))
  causal = 0.5 if re.search(r'"mask_type":\s*"[A-Z_]*CAUSAL', inst.attrs) else 1.0
  matmuls = 5 if "Backward" in name else 2
  return 2.0 * matmuls * scores * q[-1] * causal


# Matmuls per computed block of the splash attention kernels (models.attention): forward
# QK^T and PV; dq recomputes QK^T, dP = dO V^T, dQ = dS K; dkv adds dV and dK; the fused
# backward (a dkv kernel that also returns dq partials) does all five in one pass.
_SPLASH_MATMULS = (("splash_mha_fwd", 2), ("splash_mha_dq", 3), ("splash_mha_dkv", 4))


def _splash_flops(inst: _Inst, shapes: dict[str, str]) -> float:
  """FLOPs of a splash attention kernel call, from its operand shapes.

  XLA sees a Pallas kernel as an opaque custom call and counts none of its work. The query
  is the largest operand of rank >= 3: [..., heads, T, head_dim]. The kernel's tiles come
  from its block-mask operand, an int8 [heads, q blocks, kv blocks] array (square 512
  tiles when it is not found).
  """
  count = next((k for prefix, k in _SPLASH_MATMULS if inst.name.startswith(prefix)), 0)
  if not count:
    return 0.0
  operands = [a for o in inst.operands for a in _arrays(shapes.get(o, ""))]
  arrays = [dims for _, dims in operands if len(dims) >= 3]
  if not arrays:
    return 0.0
  q = max(arrays, key=math.prod)
  if count == 4 and any(len(dims) == len(q) + 1 for _, dims in _arrays(inst.shape)):
    count = 5  # fused backward: dq partials per kv block among the results
  t = q[-2]
  grid = next((dims for d, dims in operands if d == "s8" and len(dims) == 3
               and dims[1] and dims[2] and t % dims[1] == 0 and t % dims[2] == 0), None)
  block_q, block_kv = (t // grid[1], t // grid[2]) if grid else (min(t, 512), min(t, 512))
  from jaxrl_scale.models import attention  # pylint: disable=g-import-not-at-top
  return count * attention.splash_block_flops(math.prod(q[:-3]), t, q[-3], q[-1], block_q,
                                              block_kv)


# The megablox grouped matmul's kernels (models.grouped_matmul): gmm, tgmm and their
# jvp / transpose wrappers, e.g. "transpose_jvp_jit_tgmm___.2".
_MEGABLOX = re.compile(r"(^|_)t?gmm(_|\.|$)")


def flops(inst: _Inst, shapes: dict[str, str], paged_layers: int,
                  expert_shards: int = 1) -> float:
  """FLOPs of a custom call: its own cost estimate where it has one, else ours.

  Megablox's estimate is 2 m k n over every row it is handed. Under expert parallelism a
  device is handed its expert group's gathered rows, of which its own experts get 1 / ep
  when the router balances (`moe._local_experts`; the rest fall in the weightless extra
  group, whose tiles the kernel zeroes without a matmul): the estimate is divided by
  `expert_shards` = ep, so a compiled / model FLOPs ratio is not ep times too high.
  """
  m = re.search(r'"flops"\s*:\s*"?([0-9.eE+]+)', inst.attrs)
  if m:
    flops = float(m.group(1))
    return flops / expert_shards if _MEGABLOX.search(inst.name) else flops
  ragged = ragged_paged(inst, shapes, paged_layers)
  if ragged:
    return ragged[0]
  return (_splash_flops(inst, shapes) or _cublas_flops(inst, shapes)
          or _cudnn_attention_flops(inst, shapes))


# The name the Triton paged decode kernel's pallas_call carries into its backend config
# (models.paged_triton); XLA names the instruction itself pallas_call.N.
_TRITON_PAGED = 'name = "paged_decode_attention"'


def ragged_paged(inst: _Inst, shapes: dict[str, str], paged_layers: int,
                  ) -> tuple[float, float] | None:
  """(FLOPs, bytes) of one call of the ragged paged attention kernel (models.attention).

  Its operands are the queries [T, N, H] and the whole page pool as pages [L*P, C, 2K, H]
  (L = `paged_layers` layers' pages; one call reads one layer's). What a call reads
  depends on the rows' lengths; it is charged one layer's whole pool, i.e. every slot at
  the average length the pool was sized for (`sampler.kv_cache_tokens`): the pool's bytes
  / L, plus the queries, the page table and the output. FLOPs: QK^T and PV of the N query
  heads over those positions, 4 N H per position. The Triton kernel's FLOPs are its dots'
  (padding included): it pads each kv head's query group to the dot's 16 rows (in
  registers: its queries come in as [B, N, H]).
  """
  triton = _TRITON_PAGED in inst.attrs
  if not (inst.name.startswith("ragged_paged_attention_kernel") or triton):
    return None
  # The Triton kernel takes the pool twice (its keys' and its values' view of one buffer).
  operands = [a for o in dict.fromkeys(inst.operands) for a in _arrays(shapes.get(o, ""))]
  pools = [(d, dims) for d, dims in operands if len(dims) == 4]
  if not pools:
    return None
  d, pool = max(pools, key=lambda a: math.prod(a[1]))
  if triton:  # queries [B, N, H]; the page table is 3-D too
    queries = [dims for t, dims in operands if len(dims) == 3 and t.startswith(("f", "bf"))]
    kv = max(1, pool[2] // 2)  # each kv head's query group padded to the tile
    queries = [(b, kv * -(-max(1, n // kv) // 16) * 16, h) for b, n, h in queries]
  else:  # queries [T, N, H]
    queries = [dims for _, dims in operands if len(dims) == 3]
  if not queries:
    return None
  _, n, h = queries[0]
  positions = pool[0] * pool[1] / max(1, paged_layers)
  pool_bytes = _DTYPE_BYTES[d] * math.prod(pool)
  other = sum(_DTYPE_BYTES[t] * math.prod(dims) for t, dims in operands
              if (t, dims) != (d, pool))
  return 4.0 * n * h * positions, pool_bytes / max(1, paged_layers) + other + _nbytes(inst.shape)
