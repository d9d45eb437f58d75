"""Verifiable rewards: answer extraction, safe exact evaluation, verifiers by name, scoring.

  from jaxrl_scale import rewards
  scorer = rewards.Scorer("math", timeout_s=5.0)
  result = scorer.score([(response, record["answer"]) for ...])  # result.rewards, .counts

Model output is untrusted: nothing here evaluates it as code (see safe_eval.py,
answer_tokens.py and answer_parse.py). Only the standard library is imported here; the
verifiers (and mpmath) load on the first reward lookup.
"""

from jaxrl_scale.rewards.registry import (
    REASONS,
    Verdict,
    get_reward,
    list_rewards,
    register_reward,
)
from jaxrl_scale.rewards.scorer import ScoreResult, Scorer

__all__ = ["REASONS", "ScoreResult", "Scorer", "Verdict", "get_reward", "list_rewards",
           "register_reward"]
