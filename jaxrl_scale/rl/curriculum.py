"""No-Positive-Resampling: prompts the policy already solves leave all later epochs.

ScaleRL (after Polaris) keeps a history of each prompt's pass rate and permanently
removes any prompt whose historical pass rate reaches 0.9 (paper notes section 7). The
paper gives no minimum number of samples; `min_samples` (default 16 = one group of the
paper's G = 16) stops a single lucky group of a small G from retiring a prompt.

Host-side and plain Python: the state is a dict that serialises to JSON and goes into
checkpoints. Prompt ids are stored as strings (JSON object keys are strings), so 7 and
"7" name the same prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_scale.errors import UserError

STATE_VERSION = 1


@dataclasses.dataclass
class _History:
  successes: int = 0
  attempts: int = 0


class NoPositiveResampling:
  """Per-prompt pass-rate history and the retirement rule.

  Args:
    threshold: retire a prompt when successes / attempts >= threshold (paper: 0.9).
    min_samples: attempts needed before a prompt can retire.
    success_threshold: a completion counts as a success when its reward is above this
      (rewards are +-1 in ScaleRL, 0/1 in many tasks; 0 suits both).
  """

  def __init__(self, threshold: float = 0.9, min_samples: int = 16,
               success_threshold: float = 0.0):
    if not 0.0 < threshold <= 1.0:
      raise UserError(f"rl.npr_threshold: must be in (0, 1], got {threshold}")
    if int(min_samples) != min_samples or min_samples < 1:
      raise UserError(f"rl.npr_min_samples: must be an integer >= 1, got {min_samples}")
    self.threshold = float(threshold)
    self.min_samples = int(min_samples)
    self.success_threshold = float(success_threshold)
    self._history: dict[str, _History] = {}
    self._retired: set[str] = set()

  def should_keep(self, prompt_id: Any) -> bool:
    """False once the prompt has retired; unseen prompts are kept."""
    return str(prompt_id) not in self._retired

  def filter(self, prompt_ids: Iterable[Any]) -> list[Any]:
    """The ids that are still kept, in order."""
    return [p for p in prompt_ids if self.should_keep(p)]

  def pass_rate(self, prompt_id: Any) -> float | None:
    """Historical pass rate, or None for a prompt never seen."""
    h = self._history.get(str(prompt_id))
    return None if h is None or h.attempts == 0 else h.successes / h.attempts

  def update(self, prompt_ids: Sequence[Any], rewards: Any) -> list[str]:
    """Adds one batch of results to the history and retires prompts that pass the bar.

    Args:
      prompt_ids: one id per group, length P.
      rewards: [P, G] rewards (or [P] for one completion per prompt). NaN entries (for
        example padding slots) are not counted.

    Returns:
      The ids (as strings) retired by this update.
    """
    ids = [str(p) for p in prompt_ids]
    rewards_PG = np.asarray(rewards, dtype=np.float64)
    if rewards_PG.ndim == 1:
      rewards_PG = rewards_PG[:, None]
    if rewards_PG.ndim != 2 or rewards_PG.shape[0] != len(ids):
      raise ValueError(f"update: rewards of shape {np.shape(rewards)} do not match "
                       f"{len(ids)} prompt ids")
    attempted_PG = ~np.isnan(rewards_PG)
    success_P = np.sum(attempted_PG & (np.nan_to_num(rewards_PG) > self.success_threshold),
                       axis=1)
    attempts_P = np.sum(attempted_PG, axis=1)
    newly_retired = []
    for pid, successes, attempts in zip(ids, success_P, attempts_P):
      h = self._history.setdefault(pid, _History())
      h.successes += int(successes)
      h.attempts += int(attempts)
      # Retirement is permanent: late rollouts of a retired prompt (still in flight in the
      # pipeline when it retired) update its history but never bring it back.
      if pid not in self._retired and self._passes(h):
        self._retired.add(pid)
        newly_retired.append(pid)
    return newly_retired

  def _passes(self, h: _History) -> bool:
    return h.attempts >= self.min_samples and h.successes >= self.threshold * h.attempts

  def stats(self) -> dict[str, float]:
    """Scalars for logging."""
    tracked = len(self._history)
    attempts = sum(h.attempts for h in self._history.values())
    successes = sum(h.successes for h in self._history.values())
    return {
        "num_tracked": float(tracked),
        "num_retired": float(len(self._retired)),
        "frac_retired": len(self._retired) / tracked if tracked else 0.0,
        "history_pass_rate": successes / attempts if attempts else 0.0,
    }

  def state_dict(self) -> dict[str, Any]:
    """A JSON-serialisable snapshot (for checkpoints)."""
    return {
        "version": STATE_VERSION,
        "threshold": self.threshold,
        "min_samples": self.min_samples,
        "success_threshold": self.success_threshold,
        "history": {pid: [h.successes, h.attempts] for pid, h in self._history.items()},
        "retired": sorted(self._retired),
    }

  @classmethod
  def from_state_dict(cls, state: Mapping[str, Any],
                      source: str = "curriculum state") -> NoPositiveResampling:
    """Rebuilds the object saved by `state_dict`; `source` names the file in errors."""
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
      version = state.get("version") if isinstance(state, Mapping) else None
      raise UserError(f"{source}: key 'version': expected {STATE_VERSION}, got {version!r}")
    for key in ("threshold", "min_samples", "success_threshold", "history", "retired"):
      if key not in state:
        raise UserError(f"{source}: missing key {key!r}")
    try:
      out = cls(threshold=state["threshold"], min_samples=state["min_samples"],
                success_threshold=state["success_threshold"])
    except UserError as e:
      raise UserError(f"{source}: {e}") from None
    if not isinstance(state["history"], Mapping):
      raise UserError(f"{source}: key 'history': expected an object of id -> [successes, attempts]")
    for pid, entry in state["history"].items():
      if (not isinstance(entry, (list, tuple)) or len(entry) != 2 or
          not all(isinstance(v, int) and v >= 0 for v in entry) or entry[0] > entry[1]):
        raise UserError(f"{source}: key 'history.{pid}': expected [successes, attempts] with "
                        f"0 <= successes <= attempts, got {entry!r}")
      out._history[str(pid)] = _History(successes=entry[0], attempts=entry[1])
    if not isinstance(state["retired"], (list, tuple)):
      raise UserError(f"{source}: key 'retired': expected a list of prompt ids")
    out._retired = {str(pid) for pid in state["retired"]}
    return out
