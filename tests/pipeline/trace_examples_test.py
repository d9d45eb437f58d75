"""The SFT warm start's multi-turn traces (pipeline/environment.py trace_examples): a
tool-using solution is played through the real environment, one example per model turn,
the environment's tokens context only; and the CPU tool demo's task and config."""

import pathlib

import pytest

from jaxrl_scale import config
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.data import tasks
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.pipeline import environment

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("solution, stops, turns", [
    ("<python>print(2*3)</python>6", ["</python>"], ["<python>print(2*3)</python>", "6"]),
    ("a</x>b</y>c", ["</y>", "</x>"], ["a</x>", "b</y>", "c"]),  # the first found ends a turn
    ("a</x>", ["</x>"], ["a</x>"]),  # ends on a stop string: no empty last turn
    ("42", [], ["42"]),
    ("", ["</x>"], [""]),
])
def test_split_turns(solution, stops, turns):
  assert environment.split_turns(solution, stops) == turns


def _cfg(*extra):
  return config.load(ROOT / "configs" / "cpu_tool.yaml", list(extra))


def _prompts(n, tok, source="multiply/d3x4_tool"):
  task, _, params = tasks.parse_task(source)
  out = []
  for r in tasks.generate(task, n, 0, **params):
    out.append(data_sources.Prompt(id=r["id"], task=r["task"], prompt=r["prompt"],
                                   text=r["prompt"], token_ids=tuple(tok.encode(r["prompt"])),
                                   answer=r["answer"], solution=r["solution"]))
  return out


def test_a_tool_trace_is_two_examples_with_the_real_tool_output_as_context():
  cfg = _cfg()
  tok = tokenizer_lib.ByteTokenizer()
  prompts = _prompts(3, tok)
  examples, dropped = environment.trace_examples(
      prompts, tok, environment.episodes(cfg, tok), cfg.sampler.stop_strings, workers=2)
  assert dropped == 0 and len(examples) == 2 * len(prompts)
  for i, p in enumerate(prompts):
    (ctx1, turn1), (ctx2, turn2) = examples[2 * i], examples[2 * i + 1]
    a, b = (int(x) for x in p.prompt.rstrip("=").split("*"))
    assert ctx1 == list(p.token_ids)
    assert tok.decode(turn1) == f"<python>print({a}*{b})</python>"
    assert turn2 == tok.encode(str(a * b)) + [tok.eos_id]
    # The second turn's context: the prompt, the first turn, then what the sandboxed
    # program printed, in the plain chat format, and nothing of it is a target.
    assert ctx2[:len(ctx1) + len(turn1)] == ctx1 + turn1
    env_text = tok.decode(ctx2[len(ctx1) + len(turn1):])
    assert env_text == f"\n\nTool: {a * b}\n\nAssistant:"


def test_a_trace_the_environment_ends_early_is_dropped():
  cfg = _cfg("env.max_turns=1")  # the tool call is the last turn allowed: the episode ends
  tok = tokenizer_lib.ByteTokenizer()
  examples, dropped = environment.trace_examples(
      _prompts(2, tok), tok, environment.episodes(cfg, tok), cfg.sampler.stop_strings)
  assert examples == [] and dropped == 2


def test_the_tool_and_answer_styles_pose_the_compact_problems():
  params = tasks.parse_task("multiply/d3x4_tool")[2]
  tool = tasks.generate("multiply", 5, 3, **params)
  answer = tasks.generate("multiply", 5, 3, **tasks.parse_task("multiply/d3x4_answer")[2])
  compact = tasks.generate("multiply", 5, 3, digits=3, multiplier_digits=4)
  assert [r["prompt"] for r in tool] == [r["prompt"] for r in answer] \
      == [r["prompt"] for r in compact]
  for r in answer:
    a, b = (int(x) for x in r["prompt"].rstrip("=").split("*"))
    assert 100 <= a <= 999 and 1000 <= b <= 9999
    assert r["solution"] == r["answer"] == str(a * b)


def test_the_no_tool_variant_is_the_same_config_less_the_tool():
  cfg = _cfg("data.source=multiply/d3x4_answer", "env.name=", "sampler.stop_strings=[]")
  tool = _cfg()
  assert environment.episodes(cfg, None) is None
  assert tool.env.name == "python_tool" and "</python>" in tool.sampler.stop_strings
  assert (cfg.rl, cfg.optim, cfg.sft, cfg.model, cfg.run) == \
      (tool.rl, tool.optim, tool.sft, tool.model, tool.run)
