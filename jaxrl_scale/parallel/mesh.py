"""Split the device set into a trainer slice and a generator slice, each with its own mesh.

The trainer mesh has axes ('fsdp', 'tp'); the generator mesh has axes ('data', 'tp') (slots
over 'data', tensor-parallel weights over 'tp'). In colocated mode both roles get all devices
and alternate. Meshes use `AxisType.Auto`: shardings are stated explicitly at jit boundaries
(in/out shardings) and the compiler propagates them inside.

Hosts (one JAX process per host): every host gives the same block of its own devices to
each role, its first `trainer_devices / H` devices in physical order to the trainer and the
next `generator_devices / H` to its generator (H hosts). The trainer mesh spans all hosts
(its gradient all-reduce is cross-host); the generator mesh of a process holds only that
host's generator devices, so each process samples on its own and no generator computation
is a cross-process collective: the job has H generator groups. `mesh.trainer_devices` /
`generator_devices` count (or take a fraction of) all devices of the job and must split
evenly over the hosts.

Why every host holds both roles, not whole hosts per role: every process runs the training
loop in lockstep (the train step is a collective of the processes that own trainer devices;
`pipeline.loop` exchanges groups and stop requests once per step) and the new weights reach
each generator through `parallel.transfer.to_local`, an all-gather onto the same process's
trainer devices followed by a local copy. A generator-only host owns no trainer devices,
so it would need the weights moved between processes that share no device set, which
`jax.device_put` does not do across processes.

Physical order: on TPU, a device subset that does not fill a box of the torus (one or three
chips of a 2x2 host, one chip per host) is refused by `jax.make_mesh` /
`mesh_utils.create_device_mesh`. Meshes here are built by that topology-aware function
when it accepts the devices (whole slices, whole-host boxes), otherwise as a plain `Mesh`
over the devices in physical order (hosts in process order, devices by z, y, x, core). The
v5p and v4 compilers accept any such subset; the v5e and v6e compilers accept a program
spanning several hosts only on whole hosts, so on multi-host v5e / v6e slices a split is
refused with a one-line error (colocated works: the trainer takes the whole slice, each
generator its whole host).

`make_slices(cfg, devices, process_index=p)` over a simulated topology's devices (several
`process_index` values, one process) builds exactly the slices process p of a real run
builds; `jaxrl-scale plan` relies on that.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from jaxrl_scale.config import MeshConfig
from jaxrl_scale.errors import UserError

TRAINER_AXES = ("fsdp", "tp")
GENERATOR_AXES = ("data", "tp")
# With mesh.trainer_ep / generator_ep > 1 a third axis sits between the two: ('fsdp', 'expert',
# 'tp') / ('data', 'expert', 'tp'). The MoE layers split their experts over it
# (`models.moe`); every other computation treats it as more data parallelism. tp stays the
# fastest-varying axis (nearest chips), expert the next: its exchange of tokens per MoE layer
# is the next most frequent collective.
EXPERT_AXIS = "expert"

# Chips whose compiler accepts a program spanning several hosts only on a whole sub-slice
# (measured with libtpu 0.0.42 on simulated v5e:8x8 / v6e:8x8: trainer meshes of 1 or 2 chips
# per host stop with "device_count == target.Topology()->LogicalDeviceCount" or "Unexpected
# device_id", some as a fatal check that kills the process). v5p and v4 compile any subset.
_WHOLE_SUBSLICE_KINDS = ("TPU v5 lite", "TPU v5e", "TPU v6 lite", "TPU v6e")


@dataclasses.dataclass(frozen=True)
class Slices:
  """The meshes of the two roles. In colocated mode they hold the same devices.

  Attributes:
    trainer: the trainer mesh (all hosts).
    generator: this process's generator mesh (its own devices only).
    colocated: both roles share the devices.
    num_processes: hosts (JAX processes) of the job; each has one generator group.
    process_index: whose generator mesh `generator` is.
  """

  trainer: Mesh
  generator: Mesh
  colocated: bool
  num_processes: int = 1
  process_index: int = 0
  note: str = ""  # why the layout differs from the config's (`single_accelerator`)

  @property
  def generator_groups(self) -> int:
    """Generator meshes of the whole job (one per process), each running its own Sampler."""
    return self.num_processes

  def slots_per_group(self, num_slots: int) -> int:
    """This process's Sampler slots: `sampler.num_slots` counts the whole job's sequences.

    Raises:
      UserError: num_slots does not split evenly over the generator groups.
    """
    return slots_per_group(num_slots, self.generator_groups)

  @property
  def num_devices(self) -> int:
    """Devices of the whole job in either role (the compute clock's device count)."""
    trainer = {d.id for d in self.trainer.devices.flat}
    generator = {d.id for d in self.generator.devices.flat}
    if self.num_processes == 1:
      return len(trainer | generator)
    if self.colocated:
      return len(trainer)
    return len(trainer) + len(generator) * self.num_processes  # each process: its own slice

  def describe(self) -> str:
    def one(mesh: Mesh) -> str:
      shape = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
      ids = [d.id for d in mesh.devices.flat]
      return f"{mesh.devices.size} devices {ids} ({shape})"

    if self.num_processes > 1:
      kind = "colocated trainer" if self.colocated else "trainer"
      return (f"{kind}: {one(self.trainer)}; generator (this process's, one per each of "
              f"{self.num_processes} processes): {one(self.generator)}")
    note = f"\n  note: {self.note}" if self.note else ""
    if self.colocated:
      return f"colocated: {one(self.trainer)}{note}"
    return f"trainer: {one(self.trainer)}; generator: {one(self.generator)}{note}"


def slots_per_group(num_slots: int, groups: int) -> int:
  """One generator group's share of `sampler.num_slots` (the whole job's sequences).

  Raises:
    UserError: num_slots does not split evenly over the groups.
  """
  if num_slots % groups:
    raise UserError(f"config key 'sampler.num_slots': {num_slots} concurrent sequences do not "
                    f"split evenly over the job's {groups} generator groups (one per host); "
                    f"use a multiple of {groups}")
  return num_slots // groups


def simulate_cpu_devices(count: int) -> None:
  """Asks XLA for `count` CPU devices. Must run before JAX initialises its backends.

  Only has an effect on the CPU platform; on TPU/GPU the real devices are used. The count is
  per process: 2 processes x 4 simulate a job of 8 devices.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    pass  # backends already initialised (e.g. inside tests): keep what exists


def physical_order(devices: Sequence) -> list:
  """`devices` sorted by host (process), then position on the torus (z, y, x), then core.

  Devices without coordinates (CPU, test fakes) keep their id order within a host.
  """
  def key(d):
    coords = getattr(d, "coords", None)
    where = tuple(reversed(tuple(coords))) if coords is not None else ()
    return (d.process_index, where, getattr(d, "core_on_chip", 0), d.id)

  return sorted(devices, key=key)


def _layout(devices: Sequence) -> str:
  """'TPU v5: 16 hosts of 4 devices' (for error messages)."""
  hosts = {d.process_index for d in devices}
  per = len(devices) // max(len(hosts), 1)
  kind = getattr(devices[0], "device_kind", "devices") if devices else "devices"
  return f"{kind}: {len(hosts)} host{'s' if len(hosts) > 1 else ''} of {per} devices"


def _resolve_count(value: float, total: int, key: str) -> int:
  if value < 1:
    n = max(1, int(round(value * total)))
  else:
    n = int(value)
  if n > total:
    raise UserError(f"config key 'mesh.{key}': asks for {n} devices but only {total} exist")
  return n


def build_mesh(devices: Sequence, shape: tuple[int, ...], axes: tuple[str, ...]) -> Mesh:
  """A mesh over `devices` (physically ordered) that builds for any subset of a TPU slice.

  The topology-aware `mesh_utils.create_device_mesh` picks the order when it accepts the
  devices (a full slice or a box of it); it asserts on other subsets, and then the devices
  are laid out in the given (physical) order.
  """
  devices = list(devices)
  try:
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (AssertionError, ValueError, NotImplementedError):
    grid = np.array(devices, dtype=object).reshape(shape)
  return Mesh(grid, axes, axis_types=(AxisType.Auto,) * len(axes))


def _mesh(devices: list, tp: int, axes: tuple[str, str], key: str, hint: str = "",
          ep: int = 1) -> Mesh:
  """(n / tp, tp) over `axes`, or with ep > 1 (n / (ep * tp), ep, tp) with the expert axis
  in the middle (ep = 1 builds exactly the two-axis mesh, so dense runs are unchanged)."""
  n = len(devices)
  if n % tp:
    raise UserError(f"config key 'mesh.{key}': tp={tp} does not divide the slice's {n} "
                    f"devices{hint}")
  if ep == 1:
    return build_mesh(devices, (n // tp, tp), axes)
  ep_key = key.replace("_tp", "_ep")
  if (n // tp) % ep:
    raise UserError(f"config key 'mesh.{ep_key}': ep={ep} does not divide the slice's {n} "
                    f"devices / tp={tp}{hint}")
  return build_mesh(devices, (n // (tp * ep), ep, tp), (axes[0], EXPERT_AXIS, axes[1]))


def data_axes(mesh: Mesh) -> tuple[str, ...]:
  """The axes a batch splits over: the mesh's first (fsdp or data) and, when present, the
  expert axis (`EXPERT_AXIS`) after it."""
  first = mesh.axis_names[0]
  return (first, EXPERT_AXIS) if EXPERT_AXIS in mesh.shape else (first,)


def split_devices(cfg: MeshConfig, devices: list | None = None) -> tuple[list, list]:
  """Returns (trainer devices, generator devices) of one host; disjoint unless colocated.

  The trainer gets the first `trainer_devices` in physical order, the generator the next
  `generator_devices`.
  """
  devices = physical_order(devices if devices is not None else jax.devices())
  total = len(devices)
  if cfg.colocated:
    return devices, devices
  if total < 2:
    raise UserError(
        f"split trainer/generator slices need >= 2 devices, found {total}; "
        "set mesh.colocated=true or mesh.simulated_cpu_devices")
  n_train = _resolve_count(cfg.trainer_devices, total, "trainer_devices")
  n_gen = _resolve_count(cfg.generator_devices, total, "generator_devices")
  if n_train + n_gen > total:
    raise UserError(
        f"config keys 'mesh.trainer_devices' + 'mesh.generator_devices' ask for "
        f"{n_train} + {n_gen} devices but only {total} exist")
  return devices[:n_train], devices[n_train:n_train + n_gen]


def _by_process(devices: Sequence) -> dict[int, list]:
  by_process: dict[int, list] = {}
  for d in physical_order(devices):
    by_process.setdefault(d.process_index, []).append(d)
  return by_process


def split_by_process(cfg: MeshConfig, devices: list, process_index: int
                     ) -> tuple[list, list]:
  """(trainer devices of the whole job, this process's generator devices), several hosts.

  Every host gives its first `trainer_devices / H` devices in physical order to the
  trainer and the next `generator_devices / H` to its own generator; the trainer list is
  host-major, so a trainer mesh's tp groups stay inside one host when tp divides the
  per-host count. Colocated: the trainer gets every device, the generator this
  process's local ones.

  Args:
    cfg: the mesh config (counts or fractions of all devices).
    devices: every device of the job (objects with `.id` and `.process_index`).
    process_index: this process.
  """
  by_process = _by_process(devices)
  n, total = len(by_process), len(devices)
  per = {len(v) for v in by_process.values()}
  if len(per) != 1:
    raise UserError(f"processes have different numbers of devices "
                    f"({sorted(len(v) for v in by_process.values())}); multi-process runs need "
                    "the same count on every host")
  if process_index not in by_process:
    raise ValueError(f"process_index {process_index} owns none of the devices "
                     f"(processes {sorted(by_process)})")
  local = by_process[process_index]
  if cfg.colocated:
    return [d for p in sorted(by_process) for d in by_process[p]], list(local)
  counts = {}
  for key in ("trainer_devices", "generator_devices"):
    count = _resolve_count(getattr(cfg, key), total, key)
    if count % n:
      raise UserError(f"config key 'mesh.{key}': {count} devices do not split evenly over "
                      f"{n} processes (every process gives the same number of its devices to "
                      f"each role; {_layout(devices)}): use a multiple of {n}")
    counts[key] = count // n
  t, g = counts["trainer_devices"], counts["generator_devices"]
  if t + g > len(local):
    raise UserError(
        f"config keys 'mesh.trainer_devices' + 'mesh.generator_devices' ask each of the {n} "
        f"processes for {t} + {g} devices but each has {len(local)} ({_layout(devices)})")
  trainer = [d for p in sorted(by_process) for d in by_process[p][:t]]
  return trainer, list(local[t:t + g])


def _generator_tp_hint(devices: list, trainer_per_host: int, generator_per_host: int) -> str:
  """What to change when generator_tp does not divide a host's generator block."""
  return (f" of each host ({_layout(devices)}, each giving {trainer_per_host} to the trainer "
          f"and {generator_per_host} to its generator): choose a generator_tp that divides "
          f"{generator_per_host}, or counts that give each host a multiple of generator_tp "
          "generator devices, or mesh.colocated=true")


def make_slices(cfg: MeshConfig, devices: Sequence | None = None, *,
                process_index: int | None = None) -> Slices:
  """Builds the trainer and generator meshes from the config.

  Args:
    cfg: the mesh section.
    devices: the job's devices; default `jax.devices()`. They may span several
      `process_index` values without several processes running (a simulated TPU topology
      for `jaxrl-scale plan`): the split is then per host exactly as in a real run.
    process_index: whose generator mesh to build when the devices span several hosts;
      default `jax.process_index()`.

  Returns:
    The trainer mesh over all hosts and this process's generator mesh.
  """
  devices = list(devices if devices is not None else jax.devices())
  hosts = sorted({d.process_index for d in devices})
  hint = note = ""
  if len(hosts) > 1:
    index = jax.process_index() if process_index is None else process_index
    train_devs, gen_devs = split_by_process(cfg, devices, index)
    kind = getattr(devices[0], "device_kind", "")
    if not cfg.colocated and kind in _WHOLE_SUBSLICE_KINDS:
      raise UserError(
          f"config key 'mesh.colocated': {_layout(devices)}: the TPU compiler runs a program "
          "that spans hosts only on whole hosts, and a trainer/generator split gives every "
          "host to both roles (whole hosts per role are not supported); set "
          "mesh.colocated=true, or use one host (e.g. v5e-8 / v6e-8) or v5p")
    if not cfg.colocated:
      hint = _generator_tp_hint(devices, len(train_devs) // len(hosts), len(gen_devs))
    num_processes = len(hosts)
  else:
    index = hosts[0] if hosts else 0
    platform = single_accelerator(devices)
    if platform and not cfg.colocated:
      cfg = dataclasses.replace(cfg, colocated=True)
      note = (f"one {platform} device: the trainer and the generator share it "
              "(mesh.colocated=true)")
    train_devs, gen_devs = split_devices(cfg, devices)
    if not cfg.colocated:
      hint = _generator_tp_hint(devices, len(train_devs), len(gen_devs))
    num_processes = 1
  trainer = _mesh(train_devs, cfg.trainer_tp, TRAINER_AXES, "trainer_tp", ep=cfg.trainer_ep)
  generator = _mesh(gen_devs, cfg.generator_tp, GENERATOR_AXES, "generator_tp", hint,
                    ep=cfg.generator_ep)
  return Slices(trainer=trainer, generator=generator, colocated=cfg.colocated,
                num_processes=num_processes, process_index=index, note=note)


def single_accelerator(devices: Sequence) -> str:
  """The platform ('gpu', 'tpu') when `devices` are exactly one accelerator, else ''.

  One device cannot be split into a trainer and a generator slice, so `make_slices` runs
  both roles on it (colocated) instead of refusing the default config: `jaxrl-scale train`
  on one GPU works out of the box. A single CPU device keeps the error, which points at
  mesh.simulated_cpu_devices (the CPU demo simulates 8).
  """
  if len(devices) != 1:
    return ""
  platform = getattr(devices[0], "platform", "cpu")
  return "" if platform == "cpu" else platform


def single_device_mesh(device=None, axes: tuple[str, str] = TRAINER_AXES) -> Mesh:
  """A 1x1 mesh, for code paths that always take a mesh."""
  device = device if device is not None else jax.devices()[0]
  return Mesh(np.array([device]).reshape(1, 1), axes, axis_types=(AxisType.Auto,) * 2)
