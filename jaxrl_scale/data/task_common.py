"""What every built-in task generator shares: a seeded stream, a fingerprint, the checks.

The built-in tasks (data/tasks.py: arithmetic, countdown; data/code_task.py;
data/multiply_task.py) draw from `Stream` and reject bad parameters with `check`, so a
generated set is identical on every platform and a bad config key is a one-line UserError
naming the task and the key. tasks.py maps task names to generators and imports the
others; they import this module, never tasks.py (no import circle).
"""

from __future__ import annotations

import hashlib
import json

from jaxrl_scale.errors import UserError

STYLES = ("compact", "instruct")


class Stream:
  """Deterministic random integers from BLAKE2b(key, counter); platform independent."""

  def __init__(self, key: str):
    self._key = key.encode("utf-8")
    self._counter = 0

  def _u64(self) -> int:
    digest = hashlib.blake2b(self._key + self._counter.to_bytes(8, "little"),
                             digest_size=8).digest()
    self._counter += 1
    return int.from_bytes(digest, "little")

  def below(self, n: int) -> int:
    """Uniform in [0, n): rejection sampling removes the modulo bias."""
    limit = (1 << 64) - (1 << 64) % n
    while True:
      x = self._u64()
      if x < limit:
        return x % n

  def integer(self, lo: int, hi: int) -> int:
    """Uniform in [lo, hi]."""
    return lo + self.below(hi - lo + 1)


def fingerprint(task: str, params: dict, seed: int) -> str:
  text = json.dumps({"task": task, "params": params, "seed": seed}, sort_keys=True)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def check(ok: bool, task: str, key: str, message: str) -> None:
  if not ok:
    raise UserError(f"{task}.{key}: {message}")


def check_common(task: str, n: int, seed: int, style: str,
                 styles: tuple[str, ...] = STYLES) -> None:
  check(n >= 0, task, "n", f"must be >= 0, got {n}")
  check(seed >= 0, task, "seed", f"must be >= 0, got {seed}")
  check(style in styles, task, "style", f"must be one of {styles}, got {style!r}")
