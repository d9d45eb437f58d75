"""The project's TPU flags: how they reach LIBTPU_INIT_ARGS, and that libtpu acts on them."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxrl_scale import cli
from jaxrl_scale.errors import UserError
from jaxrl_scale.parallel import xla_flags

THRESHOLD = "xla_jf_spmd_threshold_for_windowed_einsum_mib"


def test_flags_are_added_once_after_the_users_own():
  env = {"LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=98304"}
  assert xla_flags.apply_tpu_flags(env) == [f"--{THRESHOLD}=1000000"]
  args = env["LIBTPU_INIT_ARGS"].split()
  assert args == ["--xla_tpu_scoped_vmem_limit_kib=98304", f"--{THRESHOLD}=1000000"]
  assert xla_flags.apply_tpu_flags(env) == [] and env["LIBTPU_INIT_ARGS"].split() == args
  # The user's own value of one of ours stays, and is not repeated.
  mine = {"LIBTPU_INIT_ARGS": f"--{THRESHOLD}=5"}
  assert xla_flags.apply_tpu_flags(mine) == [] and mine["LIBTPU_INIT_ARGS"] == f"--{THRESHOLD}=5"
  fresh = {}
  xla_flags.apply_tpu_flags(fresh)
  assert fresh["LIBTPU_INIT_ARGS"] == f"--{THRESHOLD}=1000000"


def test_switch_off_and_bad_values():
  env = {xla_flags.SWITCH: "0"}
  assert xla_flags.apply_tpu_flags(env) == [] and "LIBTPU_INIT_ARGS" not in env
  with pytest.raises(UserError, match="JAXRL_SCALE_TPU_FLAGS='yes'"):
    xla_flags.apply_tpu_flags({xla_flags.SWITCH: "yes"})
  with pytest.raises(UserError, match="LIBTPU_INIT_ARGS cannot be read"):
    xla_flags.apply_tpu_flags({"LIBTPU_INIT_ARGS": "--a='unclosed"})


def test_cli_refuses_a_bad_switch_in_one_line(monkeypatch, capsys):
  monkeypatch.setenv(xla_flags.SWITCH, "maybe")
  code = cli.main(["plan", "configs/cpu_tiny.yaml", "--topology", "v5e:2x2"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "JAXRL_SCALE_TPU_FLAGS='maybe'" in err[0]


_COMPILE = textwrap.dedent("""
    import os
    from jaxrl_scale.parallel import xla_flags
    xla_flags.apply_tpu_flags()
    os.environ.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
                      TPU_ACCELERATOR_TYPE="v5p-8")
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    topo = topologies.get_topology_desc(topology_name="v5p:2x2x4", platform="tpu")
    mesh = Mesh(np.array(topo.devices).reshape(-1), ("fsdp",))
    # An FSDP layer's shapes: tokens and weights both split over the 16 chips.
    x = jax.ShapeDtypeStruct((262144, 4096), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
    w = jax.ShapeDtypeStruct((4096, 12288), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
    loss = lambda x, w: jnp.sum(jnp.tanh(x @ w).astype(jnp.float32))
    text = jax.jit(jax.grad(loss, argnums=1)).lower(x, w).compile().as_text()
    print("WINDOWED" if "windowed_dot_general" in text else "PLAIN")
""")


def test_libtpu_drops_the_collective_matmul_loop_with_the_flags():
  """Compiled for 16 v5p chips in a fresh process (libtpu reads the flags when it loads): by
  default XLA writes the FSDP matmul as a windowed loop over the weight shards; with the
  project's flags it gathers the weights and multiplies once."""
  pytest.importorskip("libtpu")
  seen = {}
  for switch in ("1", "0"):
    env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
    env[xla_flags.SWITCH] = switch
    out = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    seen[switch] = out.stdout.strip().splitlines()[-1]
  assert seen == {"1": "PLAIN", "0": "WINDOWED"}
