"""Test setup: 8 simulated CPU devices, created before JAX initialises its backends."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (for the ahead-of-time TPU compiles of tests/plan) refuses a second load in
# parallel test workers unless told otherwise.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402  (must come after XLA_FLAGS)

# Catch silent broadcasting bugs in tests (STYLE.md).
jax.config.update("jax_numpy_rank_promotion", "raise")
