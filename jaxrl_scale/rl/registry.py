"""A name -> function table, so a research fork adds a loss without editing the trainer.

Each kind of pluggable RL function (policy losses, loss aggregations, advantage
normalisations) owns one `Registry`. Looking up a name that is not there raises
`UserError` with the closest registered names, because names come from YAML configs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from jaxrl_scale.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
  """Maps names to entries (functions or small spec objects) of one kind.

  Attributes:
    kind: what the entries are, used in error messages (e.g. "loss", "aggregation").
    config_key: the config key that selects an entry (e.g. "rl.loss"), named in error messages.
  """

  def __init__(self, kind: str, config_key: str):
    self.kind = kind
    self.config_key = config_key
    self._entries: dict[str, T] = {}

  def add(self, name: str, entry: T) -> T:
    """Registers `entry` under `name`; re-registering a name is a programming error."""
    if not name or not isinstance(name, str):
      raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
    if name in self._entries:
      raise ValueError(f"{self.kind} {name!r} is already registered")
    self._entries[name] = entry
    return entry

  def get(self, name: str) -> T:
    """Returns the entry for `name`; unknown names raise UserError with suggestions."""
    try:
      return self._entries[name]
    except (KeyError, TypeError):
      pass
    close = difflib.get_close_matches(str(name), list(self._entries), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise UserError(
        f"{self.config_key}: unknown {self.kind} {name!r}; {hint}"
        f"known: {', '.join(sorted(self._entries))}")

  def names(self) -> list[str]:
    return sorted(self._entries)

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def decorator(self, name: str) -> Callable[[T], T]:
    """`@registry.decorator("name")` registers the decorated object and returns it unchanged."""

    def wrap(entry: T) -> T:
      return self.add(name, entry)

    return wrap
