"""FLOPs and HBM bytes of a compiled program, with loop bodies counted once per iteration.

XLA's `compiled.cost_analysis()` counts the body of a while loop once, whatever its trip
count; a program built on `lax.scan` (scanned layers, micro-batch accumulation, chunked
log-probs, decode chunks) is undercounted by the product of its trip counts. This module
reads the optimized HLO text (`compiled.as_text()`, one device's program after SPMD
partitioning), finds each while loop's trip count, and sums:

  FLOPs   2 x multiply-adds of every `dot` and `convolution` (inside fusions too), plus the
          `flops` of custom calls that carry a cost estimate, and for the splash attention
          kernels (which carry none) their block-sparse matmul count from the query shape
          (the ragged paged attention kernel: QK^T and PV over one layer's full pool);
          on GPUs, cuBLAS matmuls from their dimension numbers, cuDNN's fused attention
          from its score shape (half of it under a causal mask; the backward's five
          matmuls as 2.5 forwards) and the Triton paged decode kernel like the ragged one;
          elementwise work is left out (a few percent of a transformer's FLOPs).
  bytes   operands read + results written by every top-level kernel (fusion, copy,
          collective, dot, ...), where a slice of a loop-carried buffer (dynamic-slice, or an
          in-place dynamic-update-slice or scatter) counts the slice, not the whole buffer;
          the paged attention kernels read one layer's share of their pool operand.

  collective bytes  the largest array of every collective (all-gather, all-reduce,
          reduce-scatter, all-to-all, collective-permute; inside fusions too), loop bodies
          times their trip counts: the traffic over the chip interconnect, which the roofline
          does not charge.
  kernel seconds  (given the chip's peak and HBM bandwidth) the sum over every top-level
          kernel launch of its own roofline, max(its FLOPs / peak, its bytes / bandwidth):
          a kernel that is memory-bound cannot lend its idle compute to a compute-bound one,
          so this is a tighter lower bound on the program's time than max(all FLOPs / peak,
          all bytes / bandwidth). Collectives and asynchronous copies are left out: they may
          overlap compute, and their time over the chip interconnect is not modelled.
          Split by kernel family (`family`: matmul, attention, copy, other) as well.

Each computation's totals are multiplied by how often it runs: a while body by its trip
count (from `known_trip_count`, else from its condition's `i < N` compare, the counter's
start value in the loop's initial tuple and its increment in the body: XLA's windowed
einsum loops count in steps of 2), everything else once per call. A conditional runs one
of its branches, chosen by the data at run time: it is charged its cheapest (kernel by
kernel, then bytes), which keeps every total a lower bound (both were summed before, and a
conditional printed with `true_computation=` / `false_computation=` was charged nothing).

Convolutions are counted by their valid window taps: on TPU, XLA writes many dots as
convolutions with a window over a whole head dimension padded on both sides, and charging
every tap of such a window would count the dot tens of times over.
"""

from __future__ import annotations

import dataclasses
import math
import re

from jaxrl_scale.plan import custom_calls
from jaxrl_scale.plan.hlo_text import (  # noqa: F401  (parse: hlo_cost.parse as before)
    _DTYPE_BYTES, _Inst, _arrays, _attr_list, _called, _dims, _nbytes, parse)

_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "while", "call", "conditional", "opt-barrier",
         "add-dependency", "domain"}
# Communication and asynchronous transfers: out of the kernel-by-kernel roofline.
_COMMUNICATION = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                  "ragged-all-to-all", "collective-permute", "collective-broadcast", "send",
                  "recv"}


def _overlapped(op: str) -> bool:
  return op in _COMMUNICATION or op.endswith(("-start", "-done", "-update"))


def _collective_bytes(inst: _Inst, shapes: dict[str, str]) -> float:
  """The largest array a collective (or its -start) touches; 0 for anything else."""
  if inst.opcode.removesuffix("-start") not in _COMMUNICATION:
    return 0.0
  sizes = [_DTYPE_BYTES[d] * math.prod(dims) for text in [inst.shape] + [
      shapes.get(o, "") for o in inst.operands] for d, dims in _arrays(text) if dims]
  return float(max(sizes, default=0))


@dataclasses.dataclass
class Cost:
  flops: float = 0.0
  bytes: float = 0.0
  unknown_loops: int = 0  # while loops whose trip count could not be read (counted once)
  # FLOPs in bf16-peak equivalents: a float32 dot at HIGHEST precision runs as 6 bf16 MXU
  # passes on a TPU, at HIGH as 3 (what the roofline time should charge); the costs per
  # precision are the chip's (`analyze(f32_cost=...)`).
  weighted_flops: float = 0.0
  # Every kernel's own roofline time, summed (`analyze(rates=...)`; 0 without rates).
  kernel_seconds: float = 0.0
  # The largest array of every collective (an all-gather's result, a reduce-scatter's
  # operand, an all-reduce's data), inside fusions too: what crosses the chip interconnect,
  # to within the algorithm's factor.
  collective_bytes: float = 0.0
  # kernel_seconds by kernel family (`family`: matmul, attention, copy, other).
  family_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

  def __add__(self, other: "Cost") -> "Cost":
    families = dict(self.family_seconds)
    for f, t in other.family_seconds.items():
      families[f] = families.get(f, 0.0) + t
    return Cost(self.flops + other.flops, self.bytes + other.bytes,
                self.unknown_loops + other.unknown_loops,
                self.weighted_flops + other.weighted_flops,
                self.kernel_seconds + other.kernel_seconds,
                self.collective_bytes + other.collective_bytes, families)

  def scaled(self, k: float) -> "Cost":
    return Cost(self.flops * k, self.bytes * k, self.unknown_loops, self.weighted_flops * k,
                self.kernel_seconds * k, self.collective_bytes * k,
                {f: t * k for f, t in self.family_seconds.items()})


# The families a kernel-by-kernel bound is split into, named as benchmarks/common/gpu_profile.py
# names a GPU profile's kernels (there by kernel name; here by what the kernel does).
FAMILIES = ("matmul", "attention", "copy", "other")
_ATTENTION = re.compile(r"fmha|splash|flash|paged|attention", re.I)
_COPY = re.compile(r"copy|transpose|gather|scatter|dynamic.update", re.I)


def family(inst: _Inst, flops: float) -> str:
  """A kernel's family: "attention" for the fused attention kernels (cuDNN's, splash, the
  paged decode kernels: a custom call whose target or kernel name says so), "matmul" for any
  other kernel with matmul FLOPs (a dot, a fusion holding one, cuBLAS), "copy" for data
  movement (copies, transposes, gathers, scatters, in-place updates, by opcode or fusion
  name), "other" for the rest (elementwise and reduction fusions)."""
  if inst.opcode == "custom-call":
    name = re.search(r'name = "([^"]*)"', inst.attrs)
    if _ATTENTION.search(" ".join([custom_calls.target(inst), inst.name,
                                   name.group(1) if name else ""])):
      return "attention"
  if flops > 0:
    return "matmul"
  if _COPY.search(inst.opcode) or _COPY.search(inst.name):
    return "copy"
  return "other"


def _dot_flops(inst: _Inst, shapes: dict[str, str]) -> float:
  if inst.opcode == "dot":
    out = math.prod(_dims(inst.shape))
    lhs = _dims(shapes.get(inst.operands[0], ""))
    contract = _attr_list(inst.attrs, "lhs_contracting_dims")
    return 2.0 * out * math.prod(lhs[i] for i in contract if i < len(lhs))
  return _conv_flops(inst, shapes)


def _window_taps(n: int, m: int, size: int, stride: int, lo: int, lhs_dil: int,
                 rhs_dil: int) -> int:
  """Valid (output position, window tap) pairs along one spatial dimension: taps that land
  on the (dilated) input rather than on padding or between dilated elements."""
  last = (n - 1) * lhs_dil  # the last input element, in dilated coordinates
  total = 0
  for k in range(size):
    off = k * rhs_dil - lo  # x = p * stride + off
    if lhs_dil == 1:
      first_p = 0 if off >= 0 else -(off // stride)  # ceil(-off / stride)
      last_p = min(m - 1, (last - off) // stride) if last >= off else -1
      total += max(0, last_p - first_p + 1)
    else:
      total += sum(1 for p in range(m)
                   if 0 <= p * stride + off <= last and (p * stride + off) % lhs_dil == 0)
  return total


def _conv_flops(inst: _Inst, shapes: dict[str, str]) -> float:
  """2 x multiply-adds of a convolution, padding and dilation taken into account.

  On TPU XLA writes many dots as convolutions whose spatial windows only partly overlap the
  input (a head dimension as a window of its full size with size-1 padding either side):
  charging every window tap would count those dots 32 times over.
  """
  if len(inst.operands) < 2:
    return 0.0
  labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", inst.attrs)
  lhs = _dims(shapes.get(inst.operands[0], ""))
  rhs = _dims(shapes.get(inst.operands[1], ""))
  out = _dims(inst.shape)
  if not labels or not lhs or not rhs or not out:
    return 0.0
  l_lab, r_lab, o_lab = labels.groups()
  if len(l_lab) != len(lhs) or len(r_lab) != len(rhs) or len(o_lab) != len(out):
    return 0.0
  spatial = sorted(c for c in o_lab if c.isdigit())
  win = re.search(r"window=\{([^}]*)\}", inst.attrs)
  fields = dict(re.findall(r"(\w+)=(\S+)", win.group(1))) if win else {}

  def per_dim(key: str, default: int) -> list[int]:
    if key not in fields:
      return [default] * len(spatial)
    return [int(v) for v in fields[key].split("x")]

  size = per_dim("size", 1)
  stride = per_dim("stride", 1)
  lhs_dil = per_dim("lhs_dilate", 1)
  rhs_dil = per_dim("rhs_dilate", 1)
  pads = ([tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")]
          if "pad" in fields else [(0, 0)] * len(spatial))
  macs = float(out[o_lab.index("b")] * out[o_lab.index("f")] * rhs[r_lab.index("i")])
  for d, c in enumerate(spatial):
    macs *= _window_taps(lhs[l_lab.index(c)], out[o_lab.index(c)], size[d], stride[d],
                         pads[d][0], lhs_dil[d], rhs_dil[d])
  return 2.0 * macs


TPU_F32_COST = (1.0, 3.0, 6.0)


def _passes(inst: _Inst, shapes: dict[str, str],
            f32_cost: tuple[float, float, float] = TPU_F32_COST) -> float:
  """A dot's cost in bf16-peak units per FLOP: 1 for 16-bit operands; for float32 ones
  `f32_cost` at (DEFAULT, HIGH, HIGHEST) precision (a TPU: 1, 3 and 6 bf16 MXU passes)."""
  dtypes = {d for o in inst.operands[:2] for d, _ in _arrays(shapes.get(o, ""))}
  if "f32" not in dtypes or re.search(r"algorithm=dot_(bf16_bf16|f16_f16)_f32\b", inst.attrs):
    return 1  # 16-bit operands, or float32 ones the dot's algorithm multiplies as 16-bit
  m = (re.search(r"operand_precision=\{([a-z,]*)\}", inst.attrs)
       or re.search(r'"operand_precision":\[([A-Z",]*)\]', inst.attrs))
  precision = m.group(1).lower() if m else ""
  return f32_cost[2] if "highest" in precision else f32_cost[1] if "high" in precision \
      else f32_cost[0]


def _counter(cond: list[_Inst]) -> tuple[int, int] | None:
  """(tuple index of the loop counter, bound N) of a condition `counter < N`."""
  by_name = {i.name: i for i in cond}
  for i in cond:
    if i.opcode != "compare" or len(i.operands) != 2:
      continue
    if "direction=LT" in i.attrs:
      var, bound = i.operands
    elif "direction=GT" in i.attrs:
      bound, var = i.operands
    else:
      continue
    b, v = by_name.get(bound), by_name.get(var)
    if (b is None or b.constant is None
        or not re.fullmatch(r"[su](8|16|32|64)\[\]", _strip_layout(b.shape))):
      continue
    m = re.search(r"index=(\d+)", v.attrs) if v is not None and v.opcode == "get-tuple-element" else None
    if m:
      return int(m.group(1)), b.constant
  return None


def _step(body: list[_Inst], index: int) -> int:
  """How much the body adds to tuple element `index` per iteration (1 when not found)."""
  by_name = {i.name: i for i in body}
  root = next((i for i in body if i.root), None)
  if root is None or root.opcode != "tuple" or index >= len(root.operands):
    return 1
  nxt = by_name.get(root.operands[index])
  if nxt is None or nxt.opcode != "add":
    return 1
  for x, c in (nxt.operands, nxt.operands[::-1]):
    xi, ci = by_name.get(x), by_name.get(c)
    if (xi is not None and xi.opcode == "get-tuple-element"
        and re.search(rf"index={index}\b", xi.attrs) and ci is not None
        and ci.constant is not None and ci.constant > 0):
      return ci.constant
  return 1


def _init(parent: list[_Inst], inst: _Inst, index: int) -> int:
  """The loop counter's start value, from the while's operand tuple (0 when not a constant)."""
  by_name = {i.name: i for i in parent}
  t = by_name.get(inst.operands[0]) if inst.operands else None
  if t is None or t.opcode != "tuple" or index >= len(t.operands):
    return 0
  c = by_name.get(t.operands[index])
  return c.constant if c is not None and c.constant is not None else 0


def _strip_layout(shape: str) -> str:
  return re.sub(r"\{[^}]*\}", "", shape)


def _slice_bytes(comp: list[_Inst], comps: dict[str, list[_Inst]],
                 depth: int = 0) -> dict[int, float]:
  """For a fused computation: parameter index -> bytes actually read, when every use of the
  parameter is a dynamic-slice (the rest of the buffer is never touched), an in-place
  update's target, or an operand of a nested fusion that reads it so."""
  params = {i.name: int(re.match(r"\s*(\d+)", i.operand_text).group(1))
            for i in comp if i.opcode == "parameter" and i.operand_text}
  users: dict[str, list[_Inst]] = {}
  for i in comp:
    for op in i.operands:
      users.setdefault(op, []).append(i)
  nested: dict[str, dict[int, float]] = {}

  def read(u: _Inst, name: str, depth_: int = 0) -> float | None:
    if u.opcode in ("dynamic-slice", "gather") and u.operands[0] == name:
      return _nbytes(u.shape)  # the rows read (a gather: embedding lookups)
    if u.opcode in ("slice", "bitcast") and u.operands[0] == name and depth_ < 4:
      # A static slice (one layer of a stacked pool) or a bitcast of it: what its users
      # read of it, else (a slice) the slice itself.
      got = [read(v, u.name, depth_ + 1) for v in users.get(u.name, [])]
      if got and all(g is not None for g in got):
        return sum(got)
      return _nbytes(u.shape) if u.opcode == "slice" else None
    if u.opcode in _IN_PLACE and u.operands[0] == name and u.operands.count(name) == 1:
      return 0.0  # updated in place: only the written slice moves
    if u.opcode == "fusion" and depth < 4:
      called = _called(u.attrs, "calls")
      if not called or called[0] not in comps:
        return None
      if called[0] not in nested:
        nested[called[0]] = _slice_bytes(comps[called[0]], comps, depth + 1)
      got = [nested[called[0]].get(k) for k, o in enumerate(u.operands) if o == name]
      return None if any(g is None for g in got) else sum(got)
    return None

  out = {}
  for name, index in params.items():
    us = users.get(name, [])
    reads = [read(u, name) for u in us]
    if us and all(r is not None for r in reads):
      out[index] = sum(reads)
  return out


# Ops that update operand 0 in place (XLA aliases a loop-carried buffer with the result);
# the value is the operand index of the update written.
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}


def _dus_root_bytes(comp: list[_Inst], shapes: dict[str, str]) -> float | None:
  """Bytes written by a fusion whose root updates a buffer in place (the update only): a
  dynamic-update-slice, or a scatter (a KV-cache write of one token per row), alone or as
  elements of a multi-output fusion's root tuple."""
  by_name = {i.name: i for i in comp}
  root = next((i for i in comp if i.root), None)
  if root is None:
    return None
  outs = [by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
  if not any(o is not None and o.opcode in _IN_PLACE for o in outs):
    return None
  total = 0.0
  for o in outs:
    if o is None:
      return None
    k = _IN_PLACE.get(o.opcode)
    if k is not None and len(o.operands) > k:
      total += _nbytes(shapes.get(o.operands[k], ""))
    else:
      total += _nbytes(o.shape)
  return total


class _Analyzer:

  def __init__(self, text: str, loops: bool, paged_layers: int = 1, expert_shards: int = 1,
               f32_cost: tuple[float, float, float] = TPU_F32_COST,
               rates: tuple[float, float] | None = None):
    self.comps, self.entry = parse(text)
    self.loops = loops
    self.rates = rates
    self.paged_layers = paged_layers
    self.expert_shards = expert_shards
    self.f32_cost = f32_cost
    self.memo: dict[str, Cost] = {}
    self.shapes = {c: {i.name: i.shape for i in insts} for c, insts in self.comps.items()}

  def cost(self, name: str, top_level: bool = True) -> Cost:
    key = f"{name}|{top_level}"
    if key in self.memo:
      return self.memo[key]
    total = Cost()
    insts = self.comps.get(name, [])
    shapes = self.shapes.get(name, {})
    for inst in insts:
      op = inst.opcode
      weighted_before = total.weighted_flops
      total.collective_bytes += _collective_bytes(inst, shapes)
      if op in ("dot", "convolution"):
        f = _dot_flops(inst, shapes)
        total.flops += f
        total.weighted_flops += f * _passes(inst, shapes, self.f32_cost)
      elif op == "custom-call":
        f = custom_calls.flops(inst, shapes, self.paged_layers, self.expert_shards)
        total.flops += f
        total.weighted_flops += f * (_passes(inst, shapes, self.f32_cost)
                                     if custom_calls.target(inst).startswith("__cublas$") else 1)
      if op == "while":
        body = _called(inst.attrs, "body")
        trip = _trip_count_of(inst, self.comps, insts) if self.loops else 1
        if trip is None:
          total.unknown_loops += 1
          trip = 1
        for b in body:
          total = total + self.cost(b, top_level=True).scaled(trip)
        continue
      if op == "call":
        for c in _called(inst.attrs, "to_apply"):
          total = total + self.cost(c, top_level=True)
        continue
      if op == "conditional":
        branches = [self.cost(c, top_level=True) for c in _branches(inst)]
        if branches:
          total = total + min(branches, key=_cheapness)
        continue
      if op == "fusion" or op == "custom-call":
        for c in _called(inst.attrs, "calls") + _called(inst.attrs, "called_computations"):
          inner = self.cost(c, top_level=False)
          total.flops += inner.flops
          total.weighted_flops += inner.weighted_flops
          total.collective_bytes += inner.collective_bytes
      if top_level and op not in _FREE:
        nbytes = self._kernel_bytes(inst, shapes)
        total.bytes += nbytes
        if self.rates is not None and not _overlapped(op):
          peak, bandwidth = self.rates
          kernel_flops = total.weighted_flops - weighted_before
          seconds = max(kernel_flops / peak, nbytes / bandwidth)
          total.kernel_seconds += seconds
          kind = family(inst, kernel_flops)
          total.family_seconds[kind] = total.family_seconds.get(kind, 0.0) + seconds
    self.memo[key] = total
    return total

  def _kernel_bytes(self, inst: _Inst, shapes: dict[str, str]) -> float:
    ragged = custom_calls.ragged_paged(inst, shapes, self.paged_layers)
    if ragged is not None:
      return ragged[1]
    out = _nbytes(inst.shape)
    reads = [_nbytes(shapes.get(o, "")) for o in inst.operands]
    if inst.opcode.endswith("-done"):
      return 0.0  # its -start counted the transfer
    if inst.opcode.endswith("-start"):
      # The result tuple repeats the operands (and a scalar context): count what is new.
      written = [_DTYPE_BYTES[d] * math.prod(dims) for d, dims in _arrays(inst.shape) if dims]
      for o in inst.operands:
        for d, dims in _arrays(shapes.get(o, "")):
          size = _DTYPE_BYTES[d] * math.prod(dims)
          if size in written:
            written.remove(size)
      return sum(reads) + sum(written)
    if inst.opcode in ("dynamic-slice", "gather"):
      return 2 * out + sum(reads[1:])
    if inst.opcode == "dynamic-update-slice":
      upd = reads[1] if len(reads) > 1 else 0.0
      return 2 * upd
    if inst.opcode == "fusion":
      called = _called(inst.attrs, "calls")
      if called and called[0] in self.comps:
        comp = self.comps[called[0]]
        sliced = _slice_bytes(comp, self.comps)
        reads = [sliced.get(k, r) for k, r in enumerate(reads)]
        dus = _dus_root_bytes(comp, self.shapes[called[0]])
        if dus is not None:
          out = dus
    return out + sum(reads)


def _branches(inst: _Inst) -> list[str]:
  """The computations a conditional may run: `branch_computations={...}` (an index), or
  `true_computation=`, `false_computation=` (a predicate; XLA prints either form)."""
  return (_called(inst.attrs, "branch_computations") + _called(inst.attrs, "true_computation")
          + _called(inst.attrs, "false_computation"))


def _cheapness(cost: Cost) -> tuple[float, float, float]:
  """The order in which a conditional's cheapest branch is picked: its kernel-by-kernel
  time, then bytes, then FLOPs (without rates the time is 0 for every branch)."""
  return (cost.kernel_seconds, cost.bytes, cost.weighted_flops)


def _trip_count_of(inst: _Inst, comps: dict[str, list[_Inst]],
                  parent: list[_Inst] | None = None) -> int | None:
  m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', inst.attrs)
  if m:
    return int(m.group(1))
  cond = _called(inst.attrs, "condition")
  if not cond or cond[0] not in comps:
    return None
  found = _counter(comps[cond[0]])
  if found is None:
    return None
  index, bound = found
  body = _called(inst.attrs, "body")
  step = _step(comps[body[0]], index) if body and body[0] in comps else 1
  start = _init(parent or [], inst, index)
  return max(0, -((start - bound) // step))  # ceil((bound - start) / step)


def analyze(hlo_text: str, loops: bool = True, paged_layers: int = 1,
            expert_shards: int = 1,
            f32_cost: tuple[float, float, float] = TPU_F32_COST,
            rates: tuple[float, float] | None = None) -> Cost:
  """FLOPs and bytes of one device's program; `loops=False` counts every body once (as
  XLA's own cost analysis does, for comparison). `paged_layers`: how many layers' pages the
  ragged paged attention kernel's pool operand holds (see `custom_calls.ragged_paged`).
  `expert_shards`: the mesh's expert-parallel width, by which megablox's estimates are
  divided (see `custom_calls.flops`). `f32_cost`: the chip's cost of a float32 dot at DEFAULT,
  HIGH and HIGHEST precision in bf16-peak units (`chips.Chip.f32_cost`; a TPU's by default).
  `rates`: (peak bf16 FLOP/s, HBM bytes/s) of the chip, for `Cost.kernel_seconds`."""
  a = _Analyzer(hlo_text, loops, paged_layers, expert_shards, f32_cost, rates)
  return a.cost(a.entry)
