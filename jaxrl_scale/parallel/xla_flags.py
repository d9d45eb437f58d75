"""The XLA flags the project sets on Cloud TPU, each for an effect measured by compilation.

libtpu reads its flags once, from LIBTPU_INIT_ARGS, when it loads (the first TPU backend or
topology JAX opens). `apply_tpu_flags()` adds ours there before that: the CLI calls it first
for every command (`train` on a TPU, `plan` compiling for one), and a program that drives
jaxrl_scale from Python calls it before it touches JAX's devices. A flag already named in
LIBTPU_INIT_ARGS keeps the user's value; JAXRL_SCALE_TPU_FLAGS=0 adds none. On other
platforms libtpu never loads and the variable is not read.

The flags are MaxText's for FSDP-sharded dense training (its xla_flags_library:
DISABLE_COLLECTIVE_MATMUL and CF_FOR_ALL_GATHER):

- `xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000`: no "collective matmul". By
  default XLA's SPMD partitioner splits a matmul whose weights are sharded over the fsdp axis
  into a loop over the shards that passes them around (collective-permute) and adds each
  step's partial product into a float32 accumulator of the whole output: the accumulator is
  read and written once per shard. The recipe's train step (`configs/scalerl_qwen3_8b.yaml`
  on v5p-128, fsdp 16) spent 28 s of its 163 s kernel-by-kernel roofline in those adds
  alone; without the loop each layer's weights are gathered once and multiplied once:
  163 -> 131 s kernel by kernel (MFU bound 0.63 -> 0.79), 67.04 -> 66.47 GiB per chip.
- the async-collective-fusion set (`xla_tpu_enable_async_collective_fusion`,
  `..._fuse_all_gather`, `..._multiple_steps`, `xla_tpu_overlap_compute_collective_tc`,
  `xla_enable_async_all_gather`): those gathers run as asynchronous collective fusions that
  overlap the compute (the 8B train step's 44 all-gathers are all inside them; without the
  set, 18 run synchronously), 66.47 -> 65.98 GiB, 132 s kernel by kernel.

Those are compile-time effects (`jaxrl-scale plan`, libtpu 0.0.42, 2026-11-27); no TPU has run
either way yet. Interconnect time is not in the roofline: should a run on a TPU go slower
with them, JAXRL_SCALE_TPU_FLAGS=0 restores XLA's defaults.
"""

from __future__ import annotations

import os
import shlex

from jaxrl_scale.errors import UserError

TPU_FLAGS: tuple[tuple[str, str], ...] = (
    ("xla_jf_spmd_threshold_for_windowed_einsum_mib", "1000000"),
    ("xla_tpu_enable_async_collective_fusion", "true"),
    ("xla_tpu_enable_async_collective_fusion_fuse_all_gather", "true"),
    ("xla_tpu_enable_async_collective_fusion_multiple_steps", "true"),
    ("xla_tpu_overlap_compute_collective_tc", "true"),
    ("xla_enable_async_all_gather", "true"),
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
