"""Split the device set into a trainer slice and a generator slice, each with its own mesh.

The trainer mesh has axes ('fsdp', 'tp'); the generator mesh has axes ('data', 'tp') (slots
over 'data', tensor-parallel weights over 'tp'). In colocated mode both roles get all devices
and alternate. Meshes use `AxisType.Auto`: shardings are stated explicitly at jit boundaries
(in/out shardings) and the compiler propagates them inside.
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

  def describe(self) -> str:
    def one(mesh: Mesh) -> str:
      shape = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
      ids = [d.id for d in mesh.devices.flat]
      return f"{mesh.devices.size} devices {ids} ({shape})"

    if self.colocated:
      return f"colocated: {one(self.trainer)}"
    return f"trainer: {one(self.trainer)}; generator: {one(self.generator)}"


def simulate_cpu_devices(count: int) -> None:
  """Asks XLA for `count` CPU devices. Must run before JAX initialises its backends.

  Only has an effect on the CPU platform; on TPU/GPU the real devices are used.
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


def make_slices(cfg: MeshConfig, devices: list | None = None) -> Slices:
  """Builds the trainer and generator meshes from the config."""
  train_devs, gen_devs = split_devices(cfg, devices)
  trainer = _mesh(train_devs, cfg.trainer_tp, TRAINER_AXES, "trainer_tp")
  generator = _mesh(gen_devs, cfg.generator_tp, GENERATOR_AXES, "generator_tp")
  return Slices(trainer=trainer, generator=generator, colocated=cfg.colocated)


def single_device_mesh(device=None, axes: tuple[str, str] = TRAINER_AXES) -> Mesh:
  """A 1x1 mesh, for code paths that always take a mesh."""
  device = device if device is not None else jax.devices()[0]
  return Mesh(np.array([device]).reshape(1, 1), axes, axis_types=(AxisType.Auto,) * 2)
