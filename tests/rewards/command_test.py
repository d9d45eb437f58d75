"""`jaxrl-scale reward` through the real CLI entry point."""

import json

from jaxrl_scale import cli


def _write(tmp_path, text):
  path = tmp_path / "response.txt"
  path.write_text(text, encoding="utf-8")
  return str(path)


def test_text_output_shows_extraction_and_verdict(tmp_path, capsys):
  path = _write(tmp_path, "<think>hmm</think> So the result is \\boxed{\\dfrac{3}{4}} cm.")
  rc = cli.main(["reward", "--task", "math", "--answer", "0.75", "--response-file", path])
  out = capsys.readouterr().out
  assert rc == 0
  assert "extracted: \\dfrac{3}{4}" in out
  assert "verdict:   correct" in out and "reward:    1" in out


def test_json_output(tmp_path, capsys):
  path = _write(tmp_path, "The answer is 7.")
  rc = cli.main(["reward", "--task", "arithmetic", "--answer", "8", "--response-file", path,
                 "--json", "--incorrect-reward", "0"])
  out = json.loads(capsys.readouterr().out)
  assert rc == 0
  assert out == {"task": "arithmetic", "answer": "8", "extracted": "7", "correct": False,
                 "reason": "wrong", "detail": "from answer_is: 7 vs 8", "reward": 0.0}


def test_countdown_json(tmp_path, capsys):
  path = _write(tmp_path, "(3+5)*2 = 16")
  answer = json.dumps({"numbers": [3, 5, 2], "target": 16})
  assert cli.main(["reward", "--task", "countdown", "--answer", answer, "--response-file", path,
                   "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["correct"] is True and out["extracted"] == "(3+5)*2" and out["reward"] == 1.0


def test_no_answer(tmp_path, capsys):
  path = _write(tmp_path, "<think>never finished")
  assert cli.main(["reward", "--task", "math", "--answer", "1", "--response-file", path]) == 0
  out = capsys.readouterr().out
  assert "extracted: (none)" in out and "no_answer" in out


def test_user_errors_are_one_line(tmp_path, capsys):
  path = _write(tmp_path, "1")
  cases = [
      (["--task", "maths", "--answer", "1", "--response-file", path], "did you mean 'math'"),
      (["--task", "math", "--answer", "1", "--response-file", str(tmp_path / "missing.txt")],
       "missing.txt"),
      (["--task", "countdown", "--answer", "16", "--response-file", path], "--answer"),
      (["--task", "math", "--answer", "1", "--response-file", path, "--timeout", "0"],
       "--timeout"),
  ]
  for argv, needle in cases:
    assert cli.main(["reward", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_math_shows_parsed_type_and_normal_form_of_both_sides(tmp_path, capsys):
  path = _write(tmp_path, r"So the solution set is $\boxed{x > 2}$.")
  assert cli.main(["reward", "--task", "math", "--answer", r"(2, \infty)", "--response-file",
                   path, "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["correct"] is True
  assert out["parsed"] == {
      "predicted": {"type": "inequality", "normalized": "x > 2, i.e. (2, oo)"},
      "gold": {"type": "tuple", "normalized": "(2, oo)"}}
  path = _write(tmp_path, r"\boxed{11a+c}")
  assert cli.main(["reward", "--task", "math", "--answer", "7 = 11a+c", "--response-file",
                   path]) == 0
  text = capsys.readouterr().out
  assert "predicted: expression: (11*a + c)" in text
  assert "gold:      equation: 7 = (11*a + c)" in text
  assert "verdict:   incorrect (wrong)" in text


def test_truncated_flag_refuses_the_last_number(tmp_path, capsys):
  path = tmp_path / "r.txt"
  path.write_text("adding them, 5 + 7 = 12")
  argv = ["reward", "--task", "math", "--answer", "12", "--response-file", str(path), "--json"]
  assert cli.main(argv) == 0
  assert json.loads(capsys.readouterr().out)["reward"] == 1.0
  assert cli.main([*argv, "--truncated"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["reward"] == -1.0 and out["reason"] == "no_answer"


def test_the_help_names_every_registered_reward():
  from jaxrl_scale.rewards import command, registry
  # Other tests register rewards of their own in this process: the package's are the ones.
  ours = [n for n in registry.list_rewards()
          if registry.get_reward(n).__module__.startswith("jaxrl_scale.")]
  assert list(command.REWARD_NAMES) == ours
