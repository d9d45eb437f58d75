"""Split the device set into a trainer slice and a generator slice, each with its own mesh.

The trainer mesh has axes ('fsdp', 'tp'); the generator mesh has axes ('data', 'tp') (slots
over 'data', tensor-parallel weights over 'tp'). In colocated mode both roles get all devices
and alternate. Meshes use `AxisType.Auto`: shardings are stated explicitly at jit boundaries
(in/out shardings) and the compiler propagates them inside.

Several processes (multi-host): every process gives the same number of its local devices
to each role. The trainer mesh spans all processes (its gradient all-reduce is cross-host);
the generator mesh of a process holds only that process's own generator devices, so each
process samples on its own and no generator computation is a cross-process collective.
`mesh.trainer_devices` / `generator_devices` still count (or take a fraction of) all devices
of the job, and must split evenly over the processes.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from jaxrl_scale.config import MeshConfig
from jaxrl_scale.errors import UserError

TRAINER_AXES = ("fsdp", "tp")
GENERATOR_AXES = ("data", "tp")


@dataclasses.dataclass(frozen=True)
class Slices:
  """The meshes of the two roles. In colocated mode they hold the same devices."""

  trainer: Mesh
  generator: Mesh
  colocated: bool
  num_processes: int = 1

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
    if self.colocated:
      return f"colocated: {one(self.trainer)}"
    return f"trainer: {one(self.trainer)}; generator: {one(self.generator)}"


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


def _resolve_count(value: float, total: int, key: str) -> int:
  if value < 1:
    n = max(1, int(round(value * total)))
  else:
    n = int(value)
  if n > total:
    raise UserError(f"config key 'mesh.{key}': asks for {n} devices but only {total} exist")
  return n


def _mesh(devices: list, tp: int, axes: tuple[str, str], key: str) -> Mesh:
  n = len(devices)
  if n % tp:
    raise UserError(f"config key 'mesh.{key}': tp={tp} does not divide the slice's {n} devices")
  return jax.make_mesh((n // tp, tp), axes, axis_types=(AxisType.Auto,) * 2, devices=devices)


def split_devices(cfg: MeshConfig, devices: list | None = None) -> tuple[list, list]:
  """Returns (trainer devices, generator devices); disjoint unless colocated."""
  devices = list(devices if devices is not None else jax.devices())
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


def split_by_process(cfg: MeshConfig, devices: list, process_index: int
                     ) -> tuple[list, list]:
  """(trainer devices of the whole job, this process's generator devices), several processes.

  Every process gives its first `trainer_devices / P` local devices (by id) to the
  trainer and the next `generator_devices / P` to its own generator; the trainer list is
  process-major, so a trainer mesh's tp groups stay inside one host when tp divides the
  per-process count. Colocated: the trainer gets every device, the generator this
  process's local ones.

  Args:
    cfg: the mesh config (counts or fractions of all devices).
    devices: every device of the job (objects with `.id` and `.process_index`).
    process_index: this process.
  """
  by_process: dict[int, list] = {}
  for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
    by_process.setdefault(d.process_index, []).append(d)
  n, total = len(by_process), len(devices)
  per = {len(v) for v in by_process.values()}
  if len(per) != 1:
    raise UserError(f"processes have different numbers of devices "
                    f"({sorted(len(v) for v in by_process.values())}); multi-process runs need "
                    "the same count on every host")
  local = by_process[process_index]
  if cfg.colocated:
    return [d for p in sorted(by_process) for d in by_process[p]], list(local)
  counts = {}
  for key in ("trainer_devices", "generator_devices"):
    count = _resolve_count(getattr(cfg, key), total, key)
    if count % n:
      raise UserError(f"config key 'mesh.{key}': {count} devices do not split evenly over "
                      f"{n} processes (every process gives the same number of its devices to "
                      "each role)")
    counts[key] = count // n
  t, g = counts["trainer_devices"], counts["generator_devices"]
  if t + g > len(local):
    raise UserError(
        f"config keys 'mesh.trainer_devices' + 'mesh.generator_devices' ask each of the {n} "
        f"processes for {t} + {g} devices but each has {len(local)}")
  trainer = [d for p in sorted(by_process) for d in by_process[p][:t]]
  return trainer, list(local[t:t + g])


def make_slices(cfg: MeshConfig, devices: list | None = None) -> Slices:
  """Builds the trainer and generator meshes from the config.

  With several JAX processes (and `devices` not given) the trainer mesh spans all of them
  and the generator mesh is this process's own slice (`split_by_process`).
  """
  if devices is None and jax.process_count() > 1:
    train_devs, gen_devs = split_by_process(cfg, jax.devices(), jax.process_index())
    num_processes = jax.process_count()
  else:
    train_devs, gen_devs = split_devices(cfg, devices)
    num_processes = 1
  trainer = _mesh(train_devs, cfg.trainer_tp, TRAINER_AXES, "trainer_tp")
  generator = _mesh(gen_devs, cfg.generator_tp, GENERATOR_AXES, "generator_tp")
  return Slices(trainer=trainer, generator=generator, colocated=cfg.colocated,
                num_processes=num_processes)


def single_device_mesh(device=None, axes: tuple[str, str] = TRAINER_AXES) -> Mesh:
  """A 1x1 mesh, for code paths that always take a mesh."""
  device = device if device is not None else jax.devices()[0]
  return Mesh(np.array([device]).reshape(1, 1), axes, axis_types=(AxisType.Auto,) * 2)
