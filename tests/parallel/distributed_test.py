"""Tests of the multi-host start-up: settings resolution, idempotence, errors, 2 real processes."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.parallel import distributed


@pytest.fixture(autouse=True)
def _fresh_state():
  distributed._reset_for_tests()
  yield
  distributed._reset_for_tests()


@pytest.fixture
def clean_env(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID, distributed.ENV_MODE):
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def _explicit_env(**extra):
  env = {"JAXRL_COORDINATOR": "10.0.0.2:1234", "JAXRL_NUM_PROCESSES": "4",
         "JAXRL_PROCESS_ID": "3"}
  env.update(extra)
  return env


# ---------------------------------------------------------------------------------------
# resolve(): where the settings come from.


def test_nothing_set_off_tpu_is_single():
  assert distributed.resolve(env={}, cloud_tpu=False) == distributed.Settings("single")


def test_nothing_set_on_cloud_tpu_is_auto():
  assert distributed.resolve(env={}, cloud_tpu=True) == distributed.Settings("auto")


def test_env_gives_explicit_settings_as_ints():
  s = distributed.resolve(env=_explicit_env(), cloud_tpu=False)
  assert s == distributed.Settings("explicit", "10.0.0.2:1234", 4, 3)


def test_arguments_override_env_field_by_field():
  s = distributed.resolve(process_id=1, env=_explicit_env(), cloud_tpu=False)
  assert s == distributed.Settings("explicit", "10.0.0.2:1234", 4, 1)
  s = distributed.resolve("host-a:99", 2, 0, env=_explicit_env(), cloud_tpu=False)
  assert s == distributed.Settings("explicit", "host-a:99", 2, 0)


def test_explicit_wins_over_cloud_tpu_detection():
  s = distributed.resolve(env=_explicit_env(), cloud_tpu=True)
  assert s.mode == "explicit"


def test_auto_mode_passes_partial_settings_to_jax():
  s = distributed.resolve(env={"JAXRL_DISTRIBUTED": "auto", "JAXRL_COORDINATOR": "w0:8476"},
                          cloud_tpu=False)
  assert s == distributed.Settings("auto", "w0:8476", None, None)


def test_off_mode_is_single_even_on_tpu():
  assert distributed.resolve(env={"JAXRL_DISTRIBUTED": "off"}, cloud_tpu=True).mode == "single"
  assert distributed.resolve(env={"JAXRL_DISTRIBUTED": "OFF"}, cloud_tpu=True).mode == "single"


def test_one_process_is_single_without_a_coordinator():
  assert distributed.resolve(num_processes=1, env={}, cloud_tpu=True).mode == "single"
  assert distributed.resolve(env={"JAXRL_NUM_PROCESSES": "1"}, cloud_tpu=False).mode == "single"


def test_jax_platforms_cpu_on_a_tpu_vm_stays_single(monkeypatch):
  monkeypatch.setattr(distributed, "on_cloud_tpu_vm", lambda *a, **k: True)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert distributed.resolve(env={}).mode == "single"
  monkeypatch.delenv("JAX_PLATFORMS")
  assert distributed.resolve(env={}).mode == "auto"


def _fake_pci(root, devices):
  for i, (vendor, device) in enumerate(devices):
    d = root / f"0000:00:{i:02x}.0"
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(device + "\n")
  return str(root)


def test_on_cloud_tpu_vm_reads_pci_ids(tmp_path):
  # A plain GCE VM: gVNIC has Google's vendor id but is no TPU.
  plain = _fake_pci(tmp_path / "plain", [("0x1ae0", "0x0042"), ("0x8086", "0x1237")])
  assert not distributed.on_cloud_tpu_vm(plain)
  tpu = _fake_pci(tmp_path / "tpu", [("0x1ae0", "0x0042"), ("0x1ae0", "0x0063")])
  assert distributed.on_cloud_tpu_vm(tpu)
  assert not distributed.on_cloud_tpu_vm(str(tmp_path / "missing"))


# ---------------------------------------------------------------------------------------
# resolve(): errors are one-line UserErrors naming the argument or variable.


@pytest.mark.parametrize("kwargs,env,fragment", [
    ({}, {"JAXRL_NUM_PROCESSES": "two"}, "JAXRL_NUM_PROCESSES: expected an integer"),
    ({}, {"JAXRL_DISTRIBUTED": "yes"}, "JAXRL_DISTRIBUTED: must be 'auto' or 'off'"),
    ({}, _explicit_env(JAXRL_PROCESS_ID="4"), "JAXRL_PROCESS_ID: must be < num_processes=4"),
    ({"process_id": 7}, _explicit_env(), "argument process_id: must be < num_processes=4"),
    ({"num_processes": 0}, {}, "argument num_processes: must be >= 1"),
    ({}, _explicit_env(JAXRL_PROCESS_ID="-1"), "JAXRL_PROCESS_ID: must be >= 0"),
    ({}, _explicit_env(JAXRL_COORDINATOR="10.0.0.2"), "JAXRL_COORDINATOR: expected 'host:port'"),
    ({"coordinator_address": "h:70000"}, {}, "argument coordinator_address: expected 'host:port'"),
    ({}, {"JAXRL_NUM_PROCESSES": "2"}, "missing coordinator_address (JAXRL_COORDINATOR), "
                                        "process_id (JAXRL_PROCESS_ID)"),
    ({"coordinator_address": "h:1"}, {}, "missing num_processes (JAXRL_NUM_PROCESSES)"),
    ({}, _explicit_env(JAXRL_DISTRIBUTED="off"), "JAXRL_DISTRIBUTED=off contradicts"),
])
def test_inconsistent_settings_raise_one_line_user_error(kwargs, env, fragment):
  with pytest.raises(UserError) as info:
    distributed.resolve(**kwargs, env=env, cloud_tpu=False)
  message = str(info.value)
  assert fragment in message
  assert "\n" not in message


# ---------------------------------------------------------------------------------------
# maybe_initialize(): once, idempotent, clear failures.


def test_single_process_is_a_noop_and_idempotent(clean_env):
  clean_env.setenv("JAXRL_DISTRIBUTED", "off")
  first = distributed.maybe_initialize()
  assert first == distributed.Settings("single")
  assert distributed.maybe_initialize() is first
  assert not jax.distributed.is_initialized()
  assert distributed.is_primary()
  distributed.barrier("single-process barrier is a no-op")
  assert distributed.describe().startswith("process 0/1, 8 devices (8 local, cpu)")


def test_second_start_up_with_another_layout_is_refused(clean_env):
  clean_env.setenv("JAXRL_DISTRIBUTED", "off")
  distributed.maybe_initialize()
  clean_env.delenv("JAXRL_DISTRIBUTED")
  with pytest.raises(UserError, match="already started as a single process"):
    distributed.maybe_initialize("127.0.0.1:1234", 2, 0)


def test_bad_settings_raise_before_touching_jax(clean_env):
  clean_env.setenv("JAXRL_NUM_PROCESSES", "2")
  with pytest.raises(UserError, match="missing coordinator_address"):
    distributed.maybe_initialize()
  assert not jax.distributed.is_initialized()


def test_start_up_after_jax_initialised_names_the_cause(clean_env):
  jax.devices()  # the test process's backend is up: too late for a multi-process start
  with pytest.raises(RuntimeError, match="must run before any JAX computation"):
    distributed.maybe_initialize("127.0.0.1:1", 2, 0, initialization_timeout=1)
  assert not jax.distributed.is_initialized()


# ---------------------------------------------------------------------------------------
# Two real JAX processes on CPU, 4 simulated devices each, localhost coordinator.

_WORKER = textwrap.dedent("""
    import json
    from jaxrl_scale.parallel import distributed
    settings = distributed.maybe_initialize()
    again = distributed.maybe_initialize()  # idempotent: no second jax.distributed call
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((jax.device_count(),), ("x",), devices=jax.devices())
    # Each process contributes its local shards: process p holds p + 1 on each device.
    local = np.full((jax.local_device_count(),), jax.process_index() + 1.0, np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local)
    psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh,
                                 in_specs=P("x"), out_specs=P("x")))
    total = np.asarray(psum(x).addressable_data(0))
    distributed.barrier("done")
    print("RESULT " + json.dumps(dict(
        mode=settings.mode, same=again is settings, process=jax.process_index(),
        processes=jax.process_count(), devices=jax.device_count(),
        local=jax.local_device_count(), total=float(total[0]),
        primary=distributed.is_primary())))
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.multihost
def test_two_cpu_processes_initialise_and_psum(tmp_path):
  script = tmp_path / "worker.py"
  script.write_text(_WORKER)
  port = _free_port()
  procs = []
  for pid in range(2):
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAXRL_COORDINATOR=f"127.0.0.1:{port}", JAXRL_NUM_PROCESSES="2",
               JAXRL_PROCESS_ID=str(pid))
    env.pop("JAXRL_DISTRIBUTED", None)
    procs.append(subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  results = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=120)
      assert p.returncode == 0, out[-3000:]
      line = next(l for l in out.splitlines() if l.startswith("RESULT "))
      results.append(json.loads(line[len("RESULT "):]))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for pid, r in enumerate(sorted(results, key=lambda r: r["process"])):
    assert r["mode"] == "explicit" and r["same"]
    assert (r["process"], r["processes"]) == (pid, 2)
    assert (r["devices"], r["local"]) == (8, 4)
    assert r["total"] == 4 * 1.0 + 4 * 2.0  # both processes' shards summed
    assert r["primary"] == (pid == 0)
