"""Hostile responses: code injection, huge powers, deep nesting, megabyte strings.

The whole suite runs in a child process under a generous wall-clock limit, so a hang
(even one inside C code holding the GIL) fails the test instead of stalling pytest. The
limit catches hangs; it is not a performance claim. Every verifier must return a verdict
(no exception, no timeout), the reward must be 0, and the canary file that the injection
strings try to create must not exist afterwards.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HANG_LIMIT_S = 600  # generous: the suite takes seconds; only a hang gets near this
GOLD = {"math": "42", "arithmetic": "42",
        "countdown": json.dumps({"numbers": [6, 7], "target": 42})}
_DEEP = 100_000
_MEGA = 1_000_000

# name -> response builder (the canary path is substituted into injection strings).
CASES = {
    "os_system": lambda c: f"__import__('os').system('touch {c}')",
    "os_system_boxed_with_answer":
        lambda c: f"\\boxed{{__import__('os').system('touch {c}') or 6*7}}",
    "os_system_answer_is": lambda c: f"The answer is __import__('os').system('touch {c}')",
    "eval_call": lambda c: f"The answer is eval(\"open('{c}', 'w')\")",
    "exec_call": lambda c: f"\\boxed{{exec('open(\"{c}\", \"w\").write(\"x\")')}}",
    "lambda": lambda c: f"\\boxed{{(lambda: open('{c}', 'w'))()}}",
    "fstring": lambda c: "\\boxed{f\"{__import__('os').system('touch " + c + "')}\"}",
    "dunder_subclasses": lambda c: r"\boxed{().__class__.__base__.__subclasses__()}",
    "sympy_constructor": lambda c: f"\\boxed{{Symbol('x').subs(x, open('{c}', 'w'))}}",
    "shell_substitution": lambda c: f"The answer is $(touch {c}) `touch {c}`",
    "latex_input": lambda c: r"\boxed{\input{/etc/passwd}}",
    "latex_macro_loop": lambda c: r"\boxed{\def\x{\x\x}\x}",
    "python_pow": lambda c: "9**9**9**9",
    "python_pow_answer_is": lambda c: "The answer is 9**9**9**9.",
    "latex_tower_9": lambda c: r"\boxed{9^{9^{9^{9}}}}",
    "power_tower_10": lambda c: "The answer is 10^10^10",
    "latex_tower_10": lambda c: r"\boxed{10^{10^{10}}}",
    "tower_2": lambda c: r"\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "huge_base_huge_exp": lambda c: r"\boxed{(10^{100})^{10^{100}}}",
    "pi_huge_power": lambda c: r"\boxed{\pi^{10^{100}}}",
    "sqrt_huge_index": lambda c: r"\boxed{\sqrt[10^{100}]{2}}",
    "nested_sqrt": lambda c: "\\boxed{" + "\\sqrt{" * 60 + "2" + "}" * 60 + "}",
    "division_by_zero": lambda c: r"\boxed{\frac{1}{0}}",
    "countdown_pow_line": lambda c: "(6*7)**9**9**9",
    "deep_parens": lambda c: "(" * _DEEP + "1" + ")" * _DEEP,
    "deep_parens_boxed": lambda c: "\\boxed{" + "(" * _DEEP + "1" + ")" * _DEEP + "}",
    "deep_brackets_mixed": lambda c: "[{(" * _DEEP + "1" + ")}]" * _DEEP,
    "deep_unary_minus": lambda c: "\\boxed{" + "-" * _DEEP + "1}",
    "deep_boxed": lambda c: "\\boxed{" * _DEEP + "1" + "}" * _DEEP,
    "deep_boxed_unclosed": lambda c: "\\boxed{" * _DEEP + "1",
    "deep_frac": lambda c: "\\boxed{" + "\\frac{1}{" * _DEEP + "2" + "}" * _DEEP + "}",
    "mega_digits": lambda c: "1" * _MEGA,
    "mega_digits_boxed": lambda c: "\\boxed{" + "9" * _MEGA + "}",
    "mega_letters": lambda c: "a" * _MEGA,
    "mega_thousands": lambda c: "1," * (_MEGA // 2),
    "mega_dots": lambda c: "1." * (_MEGA // 2),
    # Issue 39's number forms: spaced thousands, mixed numbers, decimal commas, "\$".
    "mega_spaced_thousands": lambda c: " ".join(["100"] * (_MEGA // 4)) + "0",
    "mega_mixed_numbers": lambda c: "2 " * (_MEGA // 2) + "1/3",
    "mega_decimal_commas": lambda c: "1,2" * (_MEGA // 3),
    "mega_escaped_dollars": lambda c: "\\$" * (_MEGA // 2) + "$",
    "mega_chat_turns": lambda c: "<|im_start|>" * (_MEGA // 12),
    "mega_braces_open": lambda c: "{" * _MEGA,
    "mega_braces_close": lambda c: "}" * _MEGA,
    "mega_answer_is": lambda c: "the answer is " * (_MEGA // 14),
    "mega_think_tags": lambda c: "<think>" * (_MEGA // 7),
    "mega_boxed_tokens": lambda c: "\\boxed 9 " * (_MEGA // 9),
    "mega_last_line": lambda c: "(" + "1+" * (_MEGA // 2) + "1)",
    "unicode_digits": lambda c: "\\boxed{٤٢} ４２",
    # Symbolic answers: evaluated at points, so every size bound must hold there too.
    "variable_tower": lambda c: r"\boxed{x^{x^{x^{x^{x}}}}}",
    "variable_huge_power": lambda c: r"\boxed{(x+1)^{10^{10}}}",
    "sin_huge_argument": lambda c: r"\boxed{\sin(10^{100})}",
    "factorial_huge": lambda c: r"\boxed{(10^{100})!}",
    "binomial_huge": lambda c: r"\boxed{\binom{10^{9}}{5}}",
    "many_symbols": lambda c: "\\boxed{" + "+".join(f"x_{{{i}}}" for i in range(150)) + "}",
    "pm_explosion": lambda c: "\\boxed{" + "\\pm 1" * 40 + "}",
    "equation_tower": lambda c: r"\boxed{x^{9^{9^{9}}} = 7}",
    "interval_tower": lambda c: r"\boxed{(9^{9^{9}}, \infty)}",
    "inequality_tower": lambda c: r"\boxed{x > 9^{9^{9^{9}}}}",
    "scientific_exponent": lambda c: r"\boxed{1e999999}",
    "deep_abs": lambda c: "\\boxed{" + "|" * 400 + "}",
    "log_zero_base": lambda c: r"\boxed{\log_1 42}",
    "many_boxes": lambda c: " and ".join(f"\\boxed{{{i}}}" for i in range(100_000)),
    "lone_surrogate_and_nul": lambda c: "\\boxed{\ud800\x00}",
}


def run_suite(canary: str) -> dict:
  """Scores every case with every built-in verifier through a Scorer (in the child)."""
  from jaxrl_scale.rewards import scorer as scorer_lib

  responses = [make(canary) for make in CASES.values()]
  out = {}
  for task, gold in GOLD.items():
    start = time.perf_counter()
    with scorer_lib.Scorer(task, correct_reward=1.0, incorrect_reward=0.0, timeout_s=60.0,
                           num_threads=2) as scorer:
      result = scorer.score([(response, gold) for response in responses])
    out[task] = {
        "seconds": time.perf_counter() - start,
        "counts": result.counts,
        "cases": {
            name: {"reward": reward,
                   "reason": verdict.reason if verdict else None,
                   "error": repr(error) if error else None}
            for name, reward, verdict, error in zip(
                CASES, result.rewards, result.verdicts, result.errors)},
    }
  return out


_CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("hostile_cases", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.run_suite(sys.argv[2])))
"""


@pytest.fixture(scope="module")
def suite():
  # Not tmp_path_factory: its ".../pytest-42/..." would put the gold "42" in every injected
  # path as a last number. Every digit of a mkdtemp name follows a letter or "_", so none
  # reads as a number.
  home = pathlib.Path(tempfile.mkdtemp(prefix="hostile"))
  canary = home / "pwned"
  yield _run_suite(canary), canary
  shutil.rmtree(home, ignore_errors=True)


def _run_suite(canary):
  repo = pathlib.Path(__file__).resolve().parents[2]
  env = dict(os.environ, PYTHONPATH=str(repo))
  proc = subprocess.run([sys.executable, "-c", _CHILD, __file__, str(canary)], cwd=repo,
                        env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_suite_size():
  assert len(CASES) >= 40


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_case_scores_zero_without_error(suite, name):
  results, _ = suite
  for task in GOLD:
    case = results[task]["cases"][name]
    assert case["error"] is None, (task, case)  # a verifier must never raise on a response
    assert case["reason"] is not None, (task, case)  # a verdict, not a timeout
    assert case["reward"] == 0.0, (task, case)


def test_scorer_counts(suite):
  results, _ = suite
  for task in GOLD:
    counts = results[task]["counts"]
    assert counts["total"] == len(CASES) and counts["correct"] == 0, (task, counts)
    assert counts["errors"] == 0 and counts["timeouts"] == 0, (task, counts)


def test_nothing_was_executed(suite):
  _, canary = suite
  assert not canary.exists()
  assert not pathlib.Path("/tmp/pwned").exists()
