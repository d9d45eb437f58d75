"""`jaxrl-scale reward`: score one response, showing what the verifier extracted and why.

  jaxrl-scale reward --task math --answer '\\frac{3}{4}' --response-file out.txt [--json]

For debugging reward functions: the same Scorer (deadline, error handling) as training.
For the math task it also prints how each side was parsed: its answer type ("interval",
"equation", "set", ...) and normalised form ("x > 2, i.e. (2, oo)" for an inequality).
"""

from __future__ import annotations

import argparse
import json
import sys


# The registered rewards (`registry.list_rewards()`, which a test holds this to), named here
# so that building the CLI parser imports no verifier.
REWARD_NAMES = ("arithmetic", "code", "code_fraction", "countdown", "countdown_subset", "math",
                "math_boxed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """Adds this command's flags (stdlib only: called whenever the CLI parser is built)."""
  parser.add_argument("--task", required=True,
                      help=f"reward function name: {', '.join(REWARD_NAMES)}")
  parser.add_argument("--answer", required=True,
                      help='ground truth, as in a record\'s "answer" field '
                           '(countdown: \'{"numbers": [3, 5, 2], "target": 16}\')')
  parser.add_argument("--response-file", required=True,
                      help="file holding the model response ('-' reads stdin)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.add_argument("--timeout", type=float, default=5.0, help="per-call deadline in seconds")
  parser.add_argument("--correct-reward", type=float, default=1.0,
                      help="reward shown for a correct response (ScaleRL: +1)")
  parser.add_argument("--incorrect-reward", type=float, default=-1.0,
                      help="reward shown for a response judged not correct (ScaleRL: -1); an "
                           "error or timeout gets none (training leaves such samples out)")
  parser.add_argument("--truncated", action="store_true",
                      help="score it as a response cut by the token budget: only an "
                           "explicit final answer (a closed \\boxed{}) counts")


def _read_response(path: str) -> str:
  from jaxrl_scale.errors import UserError
  if path == "-":
    return sys.stdin.read()
  try:
    with open(path, "rb") as f:
      return f.read().decode("utf-8", errors="replace")
  except OSError as e:
    raise UserError(f"--response-file {path}: {e.strerror or e}") from None


def run(args: argparse.Namespace) -> int:
  """Scores the response; prints the verdict. Exit status 0 whatever the verdict."""
  import logging

  from jaxrl_scale.errors import UserError
  from jaxrl_scale.rewards import scorer as scorer_lib
  from jaxrl_scale.rewards import verifiers

  if args.timeout <= 0:
    raise UserError(f"--timeout must be > 0, got {args.timeout}")
  response = _read_response(args.response_file)
  scorer = scorer_lib.Scorer(args.task, correct_reward=args.correct_reward,
                             incorrect_reward=args.incorrect_reward, timeout_s=args.timeout,
                             num_threads=1)
  # This command reports the one error itself; the scorer's log line would repeat it.
  log = logging.getLogger(scorer_lib.__name__)
  level = log.level
  log.setLevel(logging.CRITICAL)
  try:
    result = scorer.score([(response, args.answer)], truncated=[args.truncated])
  finally:
    log.setLevel(level)
    scorer.close()
  verdict, error = result.verdicts[0], result.errors[0]
  reward = result.rewards[0] if result.valid[0] else None  # NaN is not JSON
  if isinstance(error, verifiers.AnswerFormatError):
    raise UserError(f"--answer: {error}")  # a typo in the ground truth, not a model failure
  if verdict is not None:
    status, detail = verdict.reason, verdict.detail
  elif error is not None:
    status, detail = "error", f"{type(error).__name__}: {error}"
  else:
    status, detail = "timeout", f"no verdict within {args.timeout:g}s"
  out = {
      "task": args.task,
      "answer": args.answer,
      "extracted": verdict.extracted if verdict else None,
      "correct": bool(verdict and verdict.correct),
      "reason": status,
      "detail": detail,
      "reward": reward,
  }
  if args.task == "math":  # what each side was read as: the usual question when debugging
    from jaxrl_scale.rewards import math as math_answers
    sides = {"predicted": out["extracted"], "gold": args.answer}
    out["parsed"] = {}
    for side, text in sides.items():
      kind, form = math_answers.describe(text) if text is not None else ("none", "")
      out["parsed"][side] = {"type": kind, "normalized": form}
  if args.json:
    print(json.dumps(out))
  else:
    print(f"task:      {out['task']}")
    print(f"answer:    {out['answer']}")
    print(f"extracted: {out['extracted'] if out['extracted'] is not None else '(none)'}")
    for side, parsed in out.get("parsed", {}).items():
      print(f"{side + ':':<10} {parsed['type']}: {parsed['normalized']}")
    print(f"verdict:   {'correct' if out['correct'] else 'incorrect'} ({status})")
    if out["detail"]:
      print(f"detail:    {out['detail']}")
    shown = "none (invalid: training leaves it out)" if reward is None else f"{reward:g}"
    print(f"reward:    {shown}")
  return 0
