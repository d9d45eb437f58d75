"""The Sampler's weights across updates: the live copy, a posted update, and the swap.

`engine.Sampler` inherits `WeightSwap`. Its decode loop calls `_apply_pending` at every
chunk boundary, the only point where the weights change under it; `update_params` may be
called from any thread (the trainer's).

`sampler.weight_buffers` 2, the double buffer: `update_params` places the posted weights at
once (dispatched, not waited for) beside the live ones, and the loop decodes on with the
live weights until the posted copy is computed, then swaps references. Two copies at peak;
decoding never waits for the trainer. Where the sampler also holds per-layer copies of the
weights (CPU, GPU), the swap first lets the chunks already dispatched finish and drops the
old copies before building the new ones, so that one set of copies is alive at a time (as
`plan` counts), not two.

`sampler.weight_buffers` 1, one copy: `update_params` first waits for the posted weights to
be computed (the loop decodes on with the live ones meanwhile, admitting nothing new), then
asks the loop to stop at its next chunk boundary. Once every program dispatched so far has
finished, the live weights (and their per-layer copies) are deleted, and only then are the
new ones placed, in the caller's thread: a transfer that is a collective across processes
(`parallel.transfer.reshard` of trainer weights spread over hosts) stays in every process's
main thread, in step. Then the loop goes on. Called from the loop's own thread (an
`on_chunk` callback) or while no loop runs, it swaps at once. Either way sequences in flight
keep their KV cache and continue on the new weights, and every chunk's tokens carry the
version of the weights that chunk ran with. The price: `update_params` blocks until the
weights are computed plus up to one decode chunk, and decoding pauses while the new weights
are placed. A `stream` request iterator that blocks while `update_pending` is set delays the
swap (and the poster) until it returns.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import jax
from flax import nnx

from jaxrl_scale.generation import layout as layout_lib
from jaxrl_scale.parallel import transfer


class WeightSwap:
  """The weights part of `engine.Sampler` (see the module docstring).

  The Sampler sets, before `_init_swap`: `_params` (the live weights, placed),
  `_param_leaves`, `_layer_leaves` (per-layer copies or None), `_param_treedef`,
  `_param_paths`, `_param_dtypes`, `_param_shardings`, `_split_layers`, `version`; and
  `_state` (the slot state: every program that reads the weights returns the next one).
  """

  def _init_swap(self, buffers: int) -> None:
    self._buffers = buffers
    self._pending: tuple[Any, int] | None = None  # double buffer: (placed params, version)
    self._posted: tuple[list, int] | None = None  # (weak refs to the source leaves, version)
    self._lock = threading.Lock()
    self._cond = threading.Condition(self._lock)
    # One buffer: the version posted and not yet swapped in; the loop is asked to stop at
    # its next chunk boundary (`_park`) and says it has (`_parked`); the thread running it.
    self._pending_version: int | None = None
    self._park = False
    self._parked = False
    self._loop: int | None = None
    self._post_lock = threading.Lock()  # one single-buffered swap at a time

  @property
  def latest_version(self) -> int:
    """Version of the newest params posted, applied or still pending. Thread-safe."""
    with self._lock:
      if self._pending is not None:
        return self._pending[1]
      return self.version if self._pending_version is None else self._pending_version

  @property
  def params(self) -> nnx.State:
    """The params the next chunk will use (after any pending swap of the double buffer;
    with one buffer the live ones, which a swap deletes)."""
    with self._lock:
      return self._pending[0] if self._pending is not None else self._params

  @property
  def update_pending(self) -> bool:
    """Whether posted weights wait to be swapped in. Thread-safe."""
    with self._lock:
      return self._pending is not None or self._pending_version is not None

  def update_params(self, params: Any, version: int) -> None:
    """Posts new weights; the swap happens at a chunk boundary. Thread-safe.

    Args:
      params: an nnx.State with the model's structure, its pure-dict form, or the model
        itself, on any devices. It is resharded onto the generator mesh and cast to the
        sampler's dtypes in the caller's thread, so the decode loop only swaps a reference.
        With one weight buffer the call returns once the new weights are placed
        (dispatched), after the live ones are deleted (see the module docstring).
      version: policy version recorded on every token produced with these weights.
    """
    if isinstance(params, nnx.Module):
      params = nnx.split(params)[1]
    paths, leaves = layout_lib.paths_and_leaves(params)
    if paths != self._param_paths:
      raise ValueError("update_params: param tree structure differs from the sampler's model "
                       f"({len(paths)} arrays vs {len(self._param_paths)})")
    with self._lock:
      posted = self._posted
    if posted is not None and posted[1] == int(version) and all(
        ref() is x for ref, x in zip(posted[0], leaves)):
      # The very arrays already posted (an eval right after the step posted them): a
      # second transfer would only hold a third copy of the weights for a while.
      return
    params = jax.tree.unflatten(self._param_treedef, leaves)
    try:  # weak: holding the trainer's arrays would keep its old weights alive
      refs = [weakref.ref(x) for x in leaves]
    except TypeError:  # a leaf that takes no weak reference (a Python scalar)
      refs = None
    if self._buffers == 1:
      self._swap_single(params, int(version), refs)
      return
    # Dispatched, not waited for: `placed` may still be computing (the trainer's step that
    # produces `params` included). copy=True: colocated, the sampler holds buffers of its
    # own (the trainer's next step writes new masters; held, these would stay allocated).
    placed = transfer.reshard(params, self._param_shardings, self._param_dtypes, copy=True)
    with self._lock:
      self._pending = (placed, int(version))
      self._posted = None if refs is None else (refs, int(version))

  def _swap_single(self, params: Any, version: int, refs: list | None) -> None:
    """One buffer: waits for the loop's chunk boundary, frees the live weights, places
    `params` (see the module docstring)."""
    me = threading.get_ident()
    with self._post_lock:
      with self._cond:
        self._pending_version = version
        elsewhere = self._loop is not None and self._loop != me
      try:
        if elsewhere:
          # The live weights keep decoding while the trainer still computes the new ones.
          jax.block_until_ready([x for x in jax.tree.leaves(params)
                                 if isinstance(x, jax.Array)])
          with self._cond:
            self._park = True
            self._cond.notify_all()
            while self._loop is not None and self._loop != me and not self._parked:
              self._cond.wait()
        self._free_weights()
        # copy=True: colocated, never the trainer's own buffers (see `update_params`).
        placed = transfer.reshard(params, self._param_shardings, self._param_dtypes,
                                  copy=True)
        leaves = jax.tree.leaves(placed)
        layers = self._layers_of(leaves)
        with self._cond:
          self._params, self.version = placed, version
          self._param_leaves, self._layer_leaves = leaves, layers
          self._posted = None if refs is None else (refs, version)
      finally:
        with self._cond:
          self._pending_version = None
          self._park = False
          self._cond.notify_all()

  def _free_weights(self) -> None:
    """Deletes the live weights and their layer copies, once no program reads them."""
    # Every program dispatched so far that reads the weights returns the slot state.
    jax.block_until_ready(self._state)
    for x in list(self._param_leaves) + list(self._layer_leaves or ()):
      if isinstance(x, jax.Array) and not x.is_deleted():
        x.delete()

  def _sleep_weights(self) -> None:
    """`Sampler.sleep`'s weight half: frees the live weights and their layer copies (not
    while a single-buffered update is being placed)."""
    with self._cond:
      pending_single = self._pending_version is not None
    if pending_single:
      raise RuntimeError("Sampler.sleep while a single-buffered update is being placed")
    self._free_weights()
    with self._lock:
      # A later post of the very arrays posted before must place them again (they were
      # deleted here), not be skipped as already posted.
      self._posted = None

  def _wake_weights(self) -> None:
    """Before a run after `Sampler.sleep`: the newest posted weights, which must exist."""
    self._apply_pending(wait=True)  # the double buffer's posted weights, if any
    if any(x.is_deleted() for x in self._param_leaves if isinstance(x, jax.Array)):
      raise RuntimeError("the sampler was put to sleep (sampler.sleep_while_training) and no "
                         "weights were posted since: call update_params before generating")

  def _apply_pending(self, wait: bool) -> None:
    """At a chunk boundary, in the loop's thread: swaps posted weights in.

    Double buffer: once the posted copy is computed, or at once when `wait` is set (no
    sequence is live). One buffer: when the poster asks (its weights are computed), or
    whenever an update is posted and `wait` is set, stops here until the poster has
    placed the new weights.
    """
    if self._buffers == 1:
      with self._cond:
        if not (self._park or (wait and self._pending_version is not None)):
          return
      jax.block_until_ready(self._state)  # let the poster free the weights at once
      with self._cond:
        self._parked = True
        self._cond.notify_all()
        while self._pending_version is not None:
          self._cond.wait()
        self._parked = False
      return
    with self._lock:
      pending = self._pending
    if pending is None:
      return
    if not wait and not all(x.is_ready() for x in jax.tree.leaves(pending[0])):
      return
    if self._split_layers is not None:
      # Per-layer copies (CPU, GPU): the chunks dispatched before this boundary still read
      # the live weights and their copies. Building the new copies beside them would hold
      # two of each (the weights, the copies) at once, one set of copies more than `plan`
      # counts; so those chunks finish first and the old copies go before the new ones are
      # built. The price, once per update: the device idles while this boundary's host work
      # (the copies, the next dispatch) runs, as it would between synchronous chunks.
      jax.block_until_ready(self._state)
    with self._lock:
      if self._pending is pending:
        self._params, self.version = pending
        self._param_leaves = jax.tree.leaves(self._params)
        self._layer_leaves = None
        self._layer_leaves = self._layers_of(self._param_leaves)
        self._pending = None

  def _loop_running(self, running: bool) -> None:
    """The decode loop starts (in this thread) or ends; a waiting poster stops waiting."""
    with self._cond:
      self._loop = threading.get_ident() if running else None
      self._cond.notify_all()

  def _layers_of(self, param_leaves: list[jax.Array]) -> tuple[jax.Array, ...] | None:
    return None if self._split_layers is None else self._split_layers(tuple(param_leaves))
