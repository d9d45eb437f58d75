"""The XLA flags the project sets on Cloud TPU, each for an effect measured by compilation.

libtpu reads its flags once, from LIBTPU_INIT_ARGS, when it loads (the first TPU backend or
topology JAX opens). `apply_tpu_flags()` adds ours there before that: the CLI calls it first
for every command (`train` on a TPU, `plan` compiling for one), and a program that drives
jaxrl_scale from Python calls it before it touches JAX's devices. A flag already named in
LIBTPU_INIT_ARGS keeps the user's value; JAXRL_SCALE_TPU_FLAGS=0 adds none. On other
platforms libtpu never loads and the variable is not read.

The flag is MaxText's DISABLE_COLLECTIVE_MATMUL (its xla_flags_library), which its FSDP
dense recipes set:

- `xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000`: no "collective matmul". By
  default XLA's SPMD partitioner splits a matmul whose weights are sharded over the fsdp axis
  into a loop over the shards that passes them around (collective-permute) and adds each
  step's partial product into a float32 accumulator of the whole output: the accumulator is
  read and written once per shard. The recipe's train step (`configs/scalerl_qwen3_8b.yaml`
  on v5p-128, fsdp 16) spent 28 s of its 163 s kernel-by-kernel roofline in those adds
  alone; without the loop each layer's weights are gathered once and multiplied once:
  163 -> 131 s kernel by kernel (MFU bound 0.63 -> 0.79), 67.04 -> 66.47 GiB per chip. The
  Scout-shaped MoE train step (v5p-256): bound 75.8 -> 53.7 s; 84.74 -> 85.06 GiB per chip
  (10% free) with the LM head's shard_map (`rl/logprobs`).

Measured and not set: MaxText's CF_FOR_ALL_GATHER set (asynchronous collective fusions for
the gathers): with it the 8B step is 65.98 GiB and 132 s kernel by kernel, but the Scout
step's bound is 61 s instead of 53.7 (111 s with those flags alone).

Those are compile-time effects (`jaxrl-scale plan`, libtpu 0.0.42, 2026-11-27); no TPU has run
either way yet. Interconnect time is not in the roofline: should a run on a TPU go slower
with the flag, JAXRL_SCALE_TPU_FLAGS=0 restores XLA's defaults.
"""

from __future__ import annotations

import os
import shlex

from jaxrl_scale.errors import UserError

TPU_FLAGS: tuple[tuple[str, str], ...] = (
    ("xla_jf_spmd_threshold_for_windowed_einsum_mib", "1000000"),
)
SWITCH = "JAXRL_SCALE_TPU_FLAGS"


def _named(args: str) -> set[str]:
  """Flag names in a LIBTPU_INIT_ARGS string (`--name=value` or `--name`)."""
  names = set()
  for word in shlex.split(args):
    if word.startswith("--"):
      names.add(word[2:].split("=", 1)[0])
  return names


def apply_tpu_flags(environ: dict[str, str] | None = None) -> list[str]:
  """Appends `TPU_FLAGS` the user has not set to LIBTPU_INIT_ARGS; returns those added.

  Raises:
    UserError: JAXRL_SCALE_TPU_FLAGS is neither 0 nor 1.
  """
  env = os.environ if environ is None else environ
  switch = env.get(SWITCH, "1").strip()
  if switch not in ("0", "1"):
    raise UserError(f"{SWITCH}={switch!r}: use 1 (the project's TPU flags, the default) or 0 "
                    "(XLA's own defaults)")
  if switch == "0":
    return []
  current = env.get("LIBTPU_INIT_ARGS", "")
  try:
    have = _named(current)
  except ValueError as e:
    raise UserError(f"LIBTPU_INIT_ARGS cannot be read as flags ({e}): {current!r}") from None
  added = [f"--{name}={value}" for name, value in TPU_FLAGS if name not in have]
  if added:
    env["LIBTPU_INIT_ARGS"] = " ".join(filter(None, [current.strip(), *added]))
  return added
