"""Reading XLA's optimized HLO text (`compiled.as_text()`): computations, instructions,
array shapes and attributes. `hlo_cost` counts FLOPs and bytes over what this parses."""

from __future__ import annotations

import dataclasses
import math
import re

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
    "f8e4m3": 1, "f8e3m4": 1, "token": 0,
}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_NAME_EQ = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_REMAT = re.compile(r"\.remat\d*$")


@dataclasses.dataclass
class _Inst:
  name: str
  shape: str  # result type text
  opcode: str
  operands: list[str]
  attrs: str
  root: bool
  operand_text: str = ""

  @property
  def constant(self) -> int | None:
    if self.opcode != "constant":
      return None
    m = re.fullmatch(r"\s*(-?\d+)\s*", self.operand_text)
    return int(m.group(1)) if m else None


def _matching(text: str, start: int) -> int:
  """Index just past the parenthesis group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    c = text[i]
    if c in "({[":
      depth += 1
    elif c in ")}]":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _parse_inst(line: str) -> _Inst | None:
  m = _NAME_EQ.match(line)
  if not m:
    return None
  rest = line[m.end():]
  if rest.startswith("("):
    end = _matching(rest, 0)
    shape, rest = rest[:end], rest[end:].lstrip()
  else:
    sp = rest.find(" ")
    if sp < 0:
      return None
    shape, rest = rest[:sp], rest[sp + 1:].lstrip()
  p = rest.find("(")
  if p < 0:
    return None
  opcode = rest[:p].strip()
  end = _matching(rest, p)
  operand_text = rest[p + 1:end - 1]
  operands = re.findall(r"%([\w.\-]+)", operand_text)
  return _Inst(m.group(2), shape, opcode, operands, rest[end:], bool(m.group(1)),
               operand_text)


def _arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  # Layouts ({1,0:T(8,128)}) carry no brackets, so every dtype[dims] is an array.
  return [(d, tuple(int(x) for x in dims.split(",") if x))
          for d, dims in _ARRAY.findall(shape) if d in _DTYPE_BYTES]


def _nbytes(shape: str) -> float:
  return sum(_DTYPE_BYTES[d] * math.prod(dims) for d, dims in _arrays(shape))


def _dims(shape: str) -> tuple[int, ...]:
  arrs = _arrays(shape)
  return arrs[0][1] if arrs else ()


def parse(text: str) -> tuple[dict[str, list[_Inst]], str]:
  """HLO module text -> ({computation: instructions}, entry name).

  An instruction may span several lines (a Pallas kernel's backend_config holds newlines):
  a line that does not start a new instruction continues the previous one, and only a
  lone "}" ends a computation.
  """
  comps: dict[str, list[str]] = {}
  entry, current = "", None
  for line in text.splitlines():
    if current is None:
      h = _HEADER.match(line)
      if h:
        current = h.group(2)
        comps[current] = []
        if h.group(1):
          entry = current
      continue
    if line.rstrip() == "}":
      current = None
    elif line.startswith(" ") and _NAME_EQ.match(line):
      comps[current].append(line)
    elif comps[current]:
      comps[current][-1] += "\n" + line
  parsed = {}
  for name, lines in comps.items():
    insts = [_parse_inst(line) for line in lines]
    parsed[name] = [i for i in insts if i is not None]
  return parsed, entry


def _attr_list(attrs: str, key: str) -> list[int]:
  m = re.search(key + r"=\{([0-9,]*)\}", attrs)
  return [int(x) for x in m.group(1).split(",") if x] if m else []


def _called(attrs: str, key: str) -> list[str]:
  m = re.search(key + r"=\{([^}]*)\}", attrs)
  if m:
    return re.findall(r"%?([\w.\-]+)", m.group(1))
  m = re.search(key + r"=%?([\w.\-]+)", attrs)
  return [m.group(1)] if m else []


def rematerialized(text: str) -> int:
  """How many instructions of an optimized module are copies made by XLA's
  rematerialization pass (named `<original>.remat`, `.remat2`, ...): values the program
  computes again where they are used instead of keeping them, which XLA does when the
  program's peak memory is above its limit."""
  return sum(1 for line in text.splitlines()
             if (m := _NAME_EQ.match(line)) and _REMAT.search(m.group(2)))
