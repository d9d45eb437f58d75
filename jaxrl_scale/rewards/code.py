r"""The code reward: the response's program, run in the sandbox against the problem's tests.

  verdict = code.judge(response, record["answer"])   # .status, .passed, .total

The program is the last fenced code block (```python, ```py, ```python3 or a bare ```)
after the reasoning (after the last </think> when there is one); none, an unclosed
fence, or reasoning opened with <think> and never closed (a cut-off completion) is
"no_code". All stdin cases run in one sandboxed process, one after another, each
with its own stdin and its own wall clock (code_child.py); function-call cases the same.
A case the process died in without its mark (os._exit, a crash) is rerun alone as a plain
program, so a program that ends with os._exit(0) is judged as it would be run by itself.

Verdict statuses (`STATUSES`): "pass" (every case), "wrong" (an output differs, or the
output cap was hit), "timeout" (a case's wall or CPU limit, or the response's total),
"runtime_error" (an exception, a non-zero exit, a signal, no such function), "no_code".
A timeout is the program's verdict (it does not pass); a sandbox that failed to come up
raises code_sandbox.SandboxError and a malformed ground truth raises
code_tests.TestFormatError: neither is the program's fault, so the Scorer counts an error
and the sample is invalid (NaN reward), never wrong.

Registered rewards: "code" (+1 when every case passes, else -1; stops at the first
failing case) and "code_fraction" (the fraction of cases passed, mapped linearly onto
[incorrect_reward, correct_reward]; runs every case).
"""

from __future__ import annotations

import dataclasses
import re
import time

from jaxrl_scale.rewards import code_asserts
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests
from jaxrl_scale.rewards import registry

STATUSES = ("pass", "wrong", "timeout", "runtime_error", "no_code")
DEFAULT_LIMITS = code_sandbox.Limits()

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def extract_program(response: str) -> str | None:
  """The last closed ```python (or bare) fenced block after the reasoning, else None.

  Reasoning opened (<think>) and never closed is a completion cut off while it thought:
  a draft block in it is no answer (issue 63: it earned the reward)."""
  _, think, answer = response.rpartition("</think>")
  if not think and "<think>" in response:
    return None
  text = answer if think else response
  blocks = [m.group(2) for m in _FENCE_RE.finditer(text)
            if m.group(1).lower() in _PYTHON_TAGS]
  return blocks[-1] if blocks and blocks[-1].strip() else None


@dataclasses.dataclass(frozen=True)
class CodeVerdict:
  """What the tests said about one response.

  Attributes:
    status: one of STATUSES.
    passed: cases passed.
    total: cases of the problem.
    detail: which case failed and how (a traceback's last line for runtime errors).
    program: the extracted program (None: no code).
  """
  status: str
  passed: int
  total: int
  detail: str = ""
  program: str | None = None


_CASE_STATUS = {"ok": "wrong", "runtime_error": "runtime_error", "timeout": "timeout",
                "output_limit": "wrong", "stopped": "wrong"}


def judge(response: str, answer: str, *, limits: code_sandbox.Limits = DEFAULT_LIMITS,
          all_cases: bool = False) -> CodeVerdict:
  """Runs the response's program against the tests in `answer` (code_tests.parse_answer).

  Args:
    response: the untrusted model response.
    answer: the record's tests (canonical JSON or a dataset layout).
    limits: the sandbox limits (per case, and the response's total).
    all_cases: run every case (for the passed fraction) instead of stopping at the first
      failure.

  Returns:
    The CodeVerdict. Raises TestFormatError / SandboxError (not the program's fault).
  """
  spec = code_tests.parse_answer(answer)
  total = len(spec.inputs) if spec.test_code is None else 1
  program = extract_program(response)
  if program is None:
    return CodeVerdict("no_code", 0, total, "no closed ```python block")
  if spec.test_code is not None:  # assertion tests: one case, in two processes
    status, detail = code_asserts.judge(program, spec.test_code, spec.fn_name, limits)
    return CodeVerdict(status, int(status == "pass"), 1, detail, program)
  failure: list[str] = []  # [status, detail] of the first failing case
  passed, offset = 0, 0
  deadline = time.monotonic() + limits.total_wall_s

  def check(case: code_sandbox.Case, index: int) -> bool:
    if case.status != "ok":
      return False
    if spec.fn_name is not None:
      return code_tests.result_equal(case.output, spec.outputs[index], spec.wrapped)
    return code_tests.stdout_equal(case.output.decode("utf-8", "replace"), spec.outputs[index])

  def stop(cases: list[code_sandbox.Case]) -> bool:
    return not all_cases and not check(cases[-1], offset + len(cases) - 1)

  def fail(index: int, status: str, run: code_sandbox.Run) -> None:
    if not failure:
      failure.extend((status, _describe(index, status, run)))

  while offset < total and (all_cases or not failure):
    budget = deadline - time.monotonic()
    if budget <= 0:  # the response's total: every case left times out
      failure = failure or ["timeout", f"case {offset}: timeout (total {limits.total_wall_s:g}s)"]
      break
    todo = dataclasses.replace(limits, total_wall_s=budget)
    if spec.fn_name is not None:
      run = code_sandbox.run_python(program, todo, fn_name=spec.fn_name,
                                    args=spec.inputs[offset:], stop=stop)
    else:
      run = code_sandbox.run_python(program, todo, inputs=spec.inputs[offset:], stop=stop)
    for case in run.cases:  # (cases the child finished after a stop are not counted)
      if check(case, offset):
        passed += 1
      else:
        fail(offset, _CASE_STATUS[case.status], run)
      offset += 1
      if failure and not all_cases:
        break
    if run.malformed:  # marks of the program's own: its wrong output, never our error
      fail(offset, "runtime_error", run)
      break
    if offset >= total or run.status == "stopped" or (failure and not all_cases):
      break
    # The process ended inside case `offset` without its mark.
    if run.status in ("timeout", "output_limit") or spec.fn_name is not None:
      fail(offset, _CASE_STATUS[run.status] if run.status != "ok" else "runtime_error", run)
    else:  # judge that case as a plain run of its own (os._exit after the output, a crash)
      single = code_sandbox.run_python(program, todo, single_stdin=spec.inputs[offset])
      if single.status == "ok" and code_tests.stdout_equal(
          single.stdout.decode("utf-8", "replace"), spec.outputs[offset]):
        passed += 1
      else:
        fail(offset, _CASE_STATUS[single.status], single)
    offset += 1
  if passed == total:
    return CodeVerdict("pass", passed, total, f"{total} cases passed", program)
  return CodeVerdict(failure[0], passed, total, failure[1], program)


def _describe(index: int, status: str, run: code_sandbox.Run) -> str:
  detail = f"case {index}: {status}"
  # The error's line: not a traceback's frame lines, nor the head of the next case's
  # traceback (the child may have started it before a stop reached it).
  lines = [line for line in run.stderr.strip().splitlines()
           if line.strip() and not line.startswith(" ")
           and line != "Traceback (most recent call last):"]
  if status == "runtime_error" and lines:
    detail += f" ({lines[-1][:160]})"
  elif status == "runtime_error" and run.returncode < 0:
    detail += f" (signal {-run.returncode})"
  return detail


def to_verdict(verdict: CodeVerdict, *, fraction: bool = False) -> registry.Verdict:
  """A CodeVerdict as the registry's Verdict (status and counts in `detail`)."""
  detail = f"{verdict.status}: {verdict.passed}/{verdict.total}; {verdict.detail}"
  if verdict.status == "no_code":
    return registry.Verdict(False, None, registry.NO_ANSWER, detail)
  score = verdict.passed / verdict.total if fraction else None
  if verdict.status == "pass":
    return registry.Verdict(True, verdict.program, registry.CORRECT, detail, score=score)
  return registry.Verdict(False, verdict.program, registry.WRONG, detail, score=score)


@registry.register_reward("code")
def code_reward(response: str, answer: str) -> registry.Verdict:
  """+1 when the program passes every test case, else -1 (module docstring)."""
  return to_verdict(judge(response, answer))


@registry.register_reward("code_fraction")
def code_fraction_reward(response: str, answer: str) -> registry.Verdict:
  """The fraction of test cases passed, linearly between the incorrect and correct reward."""
  return to_verdict(judge(response, answer, all_cases=True), fraction=True)
