"""Orbax checkpoints of a run: device state (params, optimizer) plus host state (JSON).

Host state is everything a resumed run needs that is not an array: step, policy version,
curriculum, data iterator position, RNG seeds, compute so far, metrics offset. Both go into
one orbax step directory, saved atomically (orbax writes to a temporary directory and renames
it when complete), so a crash mid-save leaves the previous checkpoints intact.

Restore reads the arrays straight into the shardings of an abstract target (a pytree of
`jax.ShapeDtypeStruct` with `.sharding`), so no host gathers a full copy. A latest checkpoint
that cannot be read falls back to the one before it, with a warning.

Several processes: every process calls save and restore with the same step (orbax writes
each process's shards and process 0 finalises the step), so the directory must be one
that all processes see: a shared filesystem, or a `gs://` URL (passed to orbax as is).
Host state is written once, by orbax's primary process; a multi-process run's loop puts
every process's own part (data position, sequence counter) into it, keyed by process.
"""

from __future__ import annotations

import logging
import pathlib
import warnings
from typing import Any

import orbax.checkpoint as ocp

from jaxrl_scale.errors import UserError

log = logging.getLogger(__name__)

_STATE = "state"
_HOST = "host"


class _DropMessage(logging.Filter):
  """Drops log records whose message contains `text`."""

  def __init__(self, text: str):
    super().__init__()
    self.text = text

  def filter(self, record: logging.LogRecord) -> bool:
    return self.text not in record.getMessage()


def _directory(directory: str | pathlib.Path) -> Any:
  """An absolute local path, or an `epath.Path` for a URL such as gs://bucket/run."""
  text = str(directory)
  if "://" in text:
    from etils import epath  # pylint: disable=g-import-not-at-top
    return epath.Path(text)
  return pathlib.Path(directory).absolute()


class Checkpointer:
  """Save / restore with retention; async saves by default."""

  def __init__(self, directory: str | pathlib.Path, keep: int = 3, async_save: bool = True):
    self.directory = _directory(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        enable_async_checkpointing=async_save,
        create=True,
    )
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=(_STATE, _HOST))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, host: dict[str, Any]) -> None:
    """Starts saving `state` (a pytree of arrays) and `host` (JSON-serialisable) at `step`."""
    self._manager.save(
        step,
        args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardSave(state),
            _HOST: ocp.args.JsonSave(host),
        }),
        force=True,
    )

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict]:
    """Restores (step, state, host) from `step`, or the newest readable checkpoint.

    Args:
      abstract_state: pytree of jax.ShapeDtypeStruct (with shardings) matching the saved state.
      step: a specific step; None walks back from the newest until one restores.
    """
    candidates = [step] if step is not None else list(reversed(self.all_steps()))
    if not candidates:
      raise UserError(f"no checkpoint found in {self.directory}")
    errors = []
    for s in candidates:
      try:
        restored = self._manager.restore(
            s,
            args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardRestore(abstract_state),
                _HOST: ocp.args.JsonRestore(),
            }),
        )
      except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: try the previous one
        errors.append(f"step {s}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        if step is None:
          warnings.warn(
              f"checkpoint step {s} in {self.directory} is unreadable "
              f"({type(e).__name__}); falling back to an earlier one", stacklevel=2)
        continue
      return s, restored[_STATE], dict(restored[_HOST])
    raise UserError(f"no readable checkpoint in {self.directory}: " + "; ".join(errors))

  def read_arrays(self, step: int, keys: tuple[str, ...] | None = None) -> Any:
    """The saved arrays of `step` as NumPy arrays, without a target (checks, tools).

    Works on checkpoints written by any number of processes: every array is read onto
    this process's first device, whatever topology saved it. `keys`: read only these
    top-level entries (e.g. ("params",): not the optimizer state, twice their size).
    """
    # Read straight from the step's item directory, orbax warns that the step-level
    # metadata file is not in it (it is one level up): expected, not for the user.
    absl_log = logging.getLogger("absl")
    quiet = _DropMessage("Metadata file does not exist")
    absl_log.addFilter(quiet)
    try:
      return self._read_arrays(step, keys)
    finally:
      absl_log.removeFilter(quiet)

  def _read_arrays(self, step: int, keys: tuple[str, ...] | None) -> Any:
    import jax  # pylint: disable=g-import-not-at-top

    path = self.directory / str(step) / _STATE
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      meta = ocp.StandardCheckpointer().metadata(path)
    meta = getattr(meta, "item_metadata", meta)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          meta)
    if keys is None:
      restored = self._manager.restore(
          step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(target)}))
      return jax.device_get(restored[_STATE])
    missing = [k for k in keys if k not in dict(target)]
    if missing:
      raise UserError(f"{path}: holds no {missing[0]!r}")
    target = {k: dict(target)[k] for k in keys}
    restored = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
        target, restore_args=jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=device),
                                           target), partial_restore=True))
    return jax.device_get(restored)

  def wait(self) -> None:
    """Blocks until pending async saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
