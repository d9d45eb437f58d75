"""Multi-host start-up: `jax.distributed.initialize()` exactly once, before any computation.

JAX's multi-controller runtime runs the same program in every host process; each process
sees all devices of the job (`jax.devices()`) but owns only its local ones. The processes
find each other through a coordinator (process 0). Where the settings come from:

  * explicit: `maybe_initialize(coordinator_address, num_processes, process_id)`, or the
    environment variables JAXRL_COORDINATOR ("host:port"), JAXRL_NUM_PROCESSES and
    JAXRL_PROCESS_ID (arguments win over the environment, field by field);
  * auto: on a Cloud TPU VM, or with JAXRL_DISTRIBUTED=auto (what tpu_scripts/launch.sh
    sets), `jax.distributed.initialize()` detects everything from the TPU metadata;
  * single: anything else, including JAXRL_DISTRIBUTED=off or JAXRL_NUM_PROCESSES=1, is
    one process and touches nothing.

    from jaxrl_scale.parallel import distributed
    distributed.maybe_initialize()       # first thing in the entry point
    if distributed.is_primary():         # process 0 writes metrics and logs once
      ...
    everyone = distributed.allgather(x)  # host objects of all processes, in process order

`allgather` and `barrier` go through the coordination service's key-value store, never a
device collective: in a training run the main thread owns every cross-process device
collective (the train step, the trainer -> generator weight gather), and a generator
thread's local computations must not be interleaved with others' collectives.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pathlib
import pickle
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

import jax

from jaxrl_scale.errors import UserError

ENV_COORDINATOR = "JAXRL_COORDINATOR"
ENV_NUM_PROCESSES = "JAXRL_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXRL_PROCESS_ID"
ENV_MODE = "JAXRL_DISTRIBUTED"  # "auto" | "off"; unset: auto on a Cloud TPU VM, else single

# PCI ids of TPU chips (vendor Google, 0x1ae0): v4, v5p, v5e, v6e. The vendor id alone is
# not enough: every GCE VM's virtual NIC (gVNIC) is a Google PCI device too.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = frozenset({"0x005e", "0x0062", "0x0063", "0x006f"})

Mode = Literal["single", "explicit", "auto", "external"]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `maybe_initialize` decided. Unset fields (None) are left to JAX's auto-detection.

  mode: "single" (nothing to do), "explicit" (coordinator, count and id all known), "auto"
  (Cloud TPU detection) or "external" (someone else initialised jax.distributed first).
  """

  mode: Mode
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


_lock = threading.Lock()
_done: Settings | None = None


def on_cloud_tpu_vm(pci_devices: str = "/sys/bus/pci/devices") -> bool:
  """True on a host with TPU chips attached (a Cloud TPU VM), from PCI ids; no network."""
  for vendor_path in glob.glob(os.path.join(pci_devices, "*", "vendor")):
    try:
      vendor = pathlib.Path(vendor_path).read_text().strip()
      if vendor != _GOOGLE_PCI_VENDOR:
        continue
      device = (pathlib.Path(vendor_path).parent / "device").read_text().strip()
    except OSError:
      continue
    if device in _TPU_PCI_DEVICES:
      return True
  return False


def _env_int(env: Mapping[str, str], name: str) -> int | None:
  raw = env.get(name, "").strip()
  if not raw:
    return None
  try:
    return int(raw)
  except ValueError:
    raise UserError(f"environment variable {name}: expected an integer, got {raw!r}") from None


def _check_coordinator(address: str, source: str) -> None:
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise UserError(f"{source}: expected 'host:port' with a port in 1..65535, got {address!r}")


def resolve(coordinator_address: str | None = None,
            num_processes: int | None = None,
            process_id: int | None = None,
            env: Mapping[str, str] | None = None,
            cloud_tpu: bool | None = None) -> Settings:
  """Decides how to start, without touching JAX. Pure apart from reading `env` and PCI ids.

  Args:
    coordinator_address: "host:port" of process 0's coordinator service.
    num_processes: total number of processes in the job.
    process_id: this process's index in [0, num_processes).
    env: environment to read JAXRL_* variables from (default: os.environ).
    cloud_tpu: whether this is a Cloud TPU VM (default: detected from PCI ids).

  Returns:
    The Settings `maybe_initialize` would act on.

  Raises:
    UserError: on malformed or inconsistent settings, naming the argument or variable.
  """
  env = os.environ if env is None else env
  mode = env.get(ENV_MODE, "").strip().lower()
  if mode not in ("", "auto", "off"):
    raise UserError(f"environment variable {ENV_MODE}: must be 'auto' or 'off', got {mode!r}")

  # Each field: the argument if given, else the environment; remember where it came from.
  sources = {}
  if coordinator_address is None and env.get(ENV_COORDINATOR, "").strip():
    coordinator_address = env[ENV_COORDINATOR].strip()
    sources["coordinator_address"] = f"environment variable {ENV_COORDINATOR}"
  if num_processes is None:
    num_processes = _env_int(env, ENV_NUM_PROCESSES)
    sources["num_processes"] = f"environment variable {ENV_NUM_PROCESSES}"
  if process_id is None:
    process_id = _env_int(env, ENV_PROCESS_ID)
    sources["process_id"] = f"environment variable {ENV_PROCESS_ID}"

  def source(field: str) -> str:
    return sources.get(field, f"argument {field}")

  given = {k: v for k, v in (("coordinator_address", coordinator_address),
                              ("num_processes", num_processes),
                              ("process_id", process_id)) if v is not None}
  if coordinator_address is not None:
    _check_coordinator(coordinator_address, source("coordinator_address"))
  if num_processes is not None and num_processes < 1:
    raise UserError(f"{source('num_processes')}: must be >= 1, got {num_processes}")
  if process_id is not None and process_id < 0:
    raise UserError(f"{source('process_id')}: must be >= 0, got {process_id}")
  if num_processes is not None and process_id is not None and process_id >= num_processes:
    raise UserError(f"{source('process_id')}: must be < num_processes={num_processes}, "
                    f"got {process_id}")

  if mode == "off":
    if given and num_processes != 1:
      raise UserError(f"{ENV_MODE}=off contradicts {source(next(iter(given)))}="
                      f"{next(iter(given.values()))!r}; unset one of them")
    return Settings("single")
  if num_processes == 1:
    return Settings("single")
  if mode == "auto":
    # JAX fills in whatever is unset from the TPU metadata (or Slurm / Open MPI).
    return Settings("auto", coordinator_address, num_processes, process_id)
  if given:
    missing = [f for f in ("coordinator_address", "num_processes", "process_id")
               if f not in given]
    if missing:
      names = {"coordinator_address": ENV_COORDINATOR, "num_processes": ENV_NUM_PROCESSES,
               "process_id": ENV_PROCESS_ID}
      have = ", ".join(f"{source(f)}" for f in given)
      need = ", ".join(f"{f} ({names[f]})" for f in missing)
      raise UserError(f"multi-process start-up got {have} but is missing {need}; "
                      f"give all three, or set {ENV_MODE}=auto on Cloud TPU")
    return Settings("explicit", coordinator_address, num_processes, process_id)
  if cloud_tpu is None:
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    # JAX_PLATFORMS=cpu on a TPU VM (e.g. tests) means: do not join the TPU job.
    cloud_tpu = (not platforms or "tpu" in platforms) and on_cloud_tpu_vm()
  return Settings("auto") if cloud_tpu else Settings("single")


def maybe_initialize(coordinator_address: str | None = None,
                     num_processes: int | None = None,
                     process_id: int | None = None,
                     *,
                     initialization_timeout: int = 300) -> Settings:
  """Calls `jax.distributed.initialize()` once if this is a multi-process run.

  Call it before anything touches a JAX backend (`jax.devices()`, any computation). A second
  call with the same settings (or none) returns the first result; a single process is a
  no-op. See the module docstring for where the settings come from.

  Args:
    coordinator_address: "host:port" of process 0 (explicit mode).
    num_processes: total number of processes (explicit mode).
    process_id: this process's index (explicit mode).
    initialization_timeout: seconds to wait for all processes to connect.

  Returns:
    The Settings acted on.

  Raises:
    UserError: on malformed or inconsistent settings, or a second call asking for a
      different multi-process layout than the first.
    RuntimeError: when a JAX backend was initialised before this call.
  """
  global _done
  with _lock:
    wanted = resolve(coordinator_address, num_processes, process_id)
    if _done is not None:
      if wanted.mode != "single" and wanted.mode != "auto" and wanted != _done:
        raise UserError(f"jax.distributed was already started as {_describe(_done)}; "
                        f"a second start-up asked for {_describe(wanted)}")
      return _done
    if jax.distributed.is_initialized():
      # Someone (a launcher, a notebook) initialised it first: adopt their layout.
      _done = Settings("external", None, jax.process_count(), jax.process_index())
      return _done
    if wanted.mode == "single":
      _done = wanted
      return _done
    try:
      jax.distributed.initialize(
          coordinator_address=wanted.coordinator_address,
          num_processes=wanted.num_processes,
          process_id=wanted.process_id,
          initialization_timeout=initialization_timeout)
    except RuntimeError as e:
      if "before any JAX calls" in str(e) or "must be called before" in str(e):
        raise RuntimeError(
            "maybe_initialize() must run before any JAX computation or jax.devices() call "
            f"in this process ({e})") from e
      raise
    _done = Settings(wanted.mode, wanted.coordinator_address, jax.process_count(),
                     jax.process_index())
    return _done


def _describe(s: Settings) -> str:
  if s.mode == "single":
    return "a single process"
  parts = [s.mode]
  if s.num_processes is not None:
    parts.append(f"{s.num_processes} processes")
  if s.process_id is not None:
    parts.append(f"process_id={s.process_id}")
  if s.coordinator_address is not None:
    parts.append(f"coordinator={s.coordinator_address}")
  return " ".join(parts)


def is_primary() -> bool:
  """True in process 0, the one that writes metrics, logs and summaries once for the job."""
  return jax.process_index() == 0


def is_multiprocess() -> bool:
  """True when this job has more than one process."""
  return jax.process_count() > 1


def barrier(name: str, timeout_s: float = 3600.0) -> None:
  """Blocks until every process reaches the barrier `name`; a no-op in a single process.

  Use it around work that one process does for all (process 0 creating the run directory
  before the others read it). It waits on the coordination service, not on a device
  collective, so it never queues work on devices another thread may be driving.
  """
  global _kv_seq
  if jax.process_count() > 1:
    client = _client()
    if client is None:  # initialised by someone else without a client: device barrier
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(name)
      return
    with _kv_lock:
      _kv_seq += 1
      key = f"jaxrl_barrier/{_kv_seq}/{name}"
    client.wait_at_barrier(key, int(timeout_s * 1000))


# ---- host-side exchange between processes ------------------------------------------------

ENV_EXCHANGE_TIMEOUT = "JAXRL_EXCHANGE_TIMEOUT_S"
_kv_lock = threading.Lock()
_kv_seq = 0
_POLL_MS = 2000  # a blocked exchange wakes up this often, so signal handlers can run


def _client():
  """The coordination-service client of `jax.distributed` (None when not initialised)."""
  try:
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover - a JAX without the private module
    return None
  return getattr(jax_distributed.global_state, "client", None)


def allgather(obj: Any, *, name: str = "gather", timeout_s: float | None = None) -> list[Any]:
  """Every process's `obj`, in process order; `[obj]` in a single process.

  Host-side only: the objects are pickled through the coordination service's key-value
  store, so no device computation runs (the train step's device collectives and a
  generator thread's local work are untouched). Every process must make the same sequence
  of calls, from one thread; the calls are matched by their position in that sequence
  (`name` only labels the keys for debugging). Meant for small to medium objects: rollout
  groups, metrics, data positions, stop requests.

  Args:
    obj: any picklable object.
    name: a label of the call site.
    timeout_s: how long to wait for the slowest process (default: the environment
      variable JAXRL_EXCHANGE_TIMEOUT_S, else 3600).

  Returns:
    [process 0's obj, process 1's obj, ...].

  Raises:
    RuntimeError: a process did not contribute within the timeout.
  """
  global _kv_seq
  n = jax.process_count()
  if n == 1:
    return [obj]
  client = _client()
  if client is None:
    raise RuntimeError("allgather needs jax.distributed initialised by maybe_initialize()")
  if timeout_s is None:
    timeout_s = float(os.environ.get(ENV_EXCHANGE_TIMEOUT, "3600"))
  with _kv_lock:
    _kv_seq += 1
    seq = _kv_seq
  me = jax.process_index()
  client.key_value_set_bytes(f"jaxrl_kv/{seq}/{me}", pickle.dumps(obj, protocol=5))
  out: list[Any] = []
  deadline = time.monotonic() + timeout_s
  for p in range(n):
    while True:
      try:
        raw = client.blocking_key_value_get_bytes(f"jaxrl_kv/{seq}/{p}", _POLL_MS)
        break
      except Exception as e:  # noqa: BLE001 - the client raises a generic error on timeout
        if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
          raise
        if time.monotonic() > deadline:
          raise RuntimeError(f"process {me}: process {p} sent nothing for {name!r} within "
                             f"{timeout_s:.0f} s ({ENV_EXCHANGE_TIMEOUT})") from None
    out.append(obj if p == me else pickle.loads(raw))
  # Everyone has published call `seq`, so everyone has finished reading call `seq - 1`.
  if seq > 1:
    try:
      client.key_value_delete(f"jaxrl_kv/{seq - 1}/{me}")
    except Exception:  # noqa: BLE001 - a leftover key only costs coordinator memory
      pass
  return out


def describe() -> str:
  """One line for logs: 'process 1/2, 8 devices (4 local, cpu)'."""
  return (f"process {jax.process_index()}/{jax.process_count()}, {jax.device_count()} devices "
          f"({jax.local_device_count()} local, {jax.default_backend()})")


def _reset_for_tests() -> None:
  """Forgets the recorded start-up (tests of idempotence only; JAX itself is untouched)."""
  global _done
  with _lock:
    _done = None
