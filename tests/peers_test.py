"""benchmarks/peers/: what can fail without the peers installed (CI has neither Tunix nor
TRL, nor a network). The agreement and ratio arithmetic against hand computations, a
missing peer reported in one line, and our side of the JSON-lines protocol on a tiny random
checkpoint written here. No timing is judged (a loaded machine must pass)."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.peers import peer_sides, peers  # pylint: disable=wrong-import-position


def test_agreement_by_hand():
  ours = [[5, 6, 7, 8], [1, 2, 3], [9]]
  theirs = [[5, 6, 0, 8], [1, 2, 3], [9, 4]]
  got = peers.agreement(ours, theirs)
  # Row 1: 3 of 4 agree; row 2: 3 of 3; row 3: 1 of 2 (a token only one side has).
  assert got["tokens"] == pytest.approx(7 / 9)
  assert got["rows"] == pytest.approx(1 / 3)
  assert got["first_diff"] == 2  # first differences at 2, 3 (none: its length), 1
  with pytest.raises(ValueError):
    peers.agreement([[1]], [[1], [2]])


def test_ratios_by_hand():
  got = peers.ratios([300.0, 100.0, 200.0], [100.0, 100.0, 50.0])
  assert got["median"] == pytest.approx(200.0 / 100.0)
  assert got["per_round"] == pytest.approx([3.0, 1.0, 4.0])


def test_train_comparison_by_hand():
  # Steps of 2 s and 4 s against 1 s and 8 s: rates 0.5, 0.25 against 1, 0.125.
  got = peers.compare_steps([2.0, 4.0], [1.0, 8.0], [1.0, -0.5, 0.0], [1.1, -0.5, 0.0])
  assert got["ratio"]["median"] == pytest.approx(0.375 / 0.5625)
  assert got["ratio"]["per_round"] == pytest.approx([0.5, 2.0])
  assert got["loss_rel_diff"] == pytest.approx([0.1 / 1.1, 0.0, 0.0])


def test_trl_side_helpers():
  assert peer_sides.cut_at_eos([5, 7, 0, 0], {7, 9}) == [5, 7]
  assert peer_sides.cut_at_eos([5, 6], {7}) == [5, 6]
  assert peer_sides.cut_at_eos([9, 7], {7, 9}) == [9]
  if importlib.util.find_spec("tokenizers") and importlib.util.find_spec("transformers"):
    tok = peer_sides.id_tokenizer_hf(50, eos_id=2)
    assert tok("17 4 49")["input_ids"] == [17, 4, 49]
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2 and tok.padding_side == "left"


def test_peers_flag():
  assert peers.parse_args([]).peer_names == ["tunix", "trl"]
  assert peers.parse_args(["--peers", "trl"]).peer_names == ["trl"]
  with pytest.raises(SystemExit):
    peers.parse_args(["--peers", "vllm"])
  assert set(peers.SAMPLE_UNEQUAL) == set(peers.TRAIN_UNEQUAL) == {"tunix", "trl"}


def test_eos_marking_and_lengths():
  eos = [7, 9]
  assert peers.mark_eos([[1, 7], [1, 2], [9], []], eos) == [[1, -1], [1, 2], [-1], []]
  summary = peers.lengths_summary([[1] * 4, [1] * 2, [1] * 4], cap=4)
  assert summary == {"mean": pytest.approx(10 / 3), "min": 2, "max": 4,
                     "capped": pytest.approx(2 / 3)}


def test_workloads_are_the_same_for_both_sides():
  args = peers.parse_args(["--batches", "2,4", "--prompt-len", "32", "--rl-waves", "3"])
  works = peers.sample_workloads(1000, args)
  assert [w["name"] for w in works] == ["uniform_b2", "uniform_b4", "rl_b2", "rl_b4"]
  assert works == peers.sample_workloads(1000, args)  # seeded
  for w in works:
    assert all(0 not in p and 0 < len(p) <= 32 for p in w["prompts"])  # 0 is Tunix's pad
    if w["kind"] == "rl":
      assert len(w["prompts"]) == 3 * w["batch"] and w["buckets"] == [16, 32]
      assert not set(w["eos"]) & {t for p in w["prompts"] for t in p}
      assert len(w["eos"]) == 1000 // args.eos_every
    else:
      assert w["eos"] == [] and {len(p) for p in w["prompts"]} == {32}


def test_missing_peer_is_one_line():
  missing = peers.Side("tunix", "/nonexistent/bin/python")
  assert missing.absent.startswith("no Python at /nonexistent/bin/python")
  assert "\n" not in missing.absent
  assert missing.call("sample")["ok"] is False
  for peer, dist, module in (("tunix", "google-tunix", "tunix"), ("trl", "trl", "trl")):
    if importlib.util.find_spec(module) is None:
      here = peers.Side(peer, sys.executable)  # a Python without the peer
      assert here.absent == f"{dist} is not installed in {sys.executable}"
      assert here.proc is None  # closed


def test_bad_requests_answer_one_line():
  proc = subprocess.run(
      [sys.executable, peers.SIDES_PY, "ours"], capture_output=True, text=True, timeout=120,
      input='{"cmd": "nonsense"}\n{"cmd": "sample", "prompts": [[1]]}\n')
  answers = [json.loads(x) for x in proc.stdout.splitlines()]
  assert [a["ok"] for a in answers] == [False, False]
  assert answers[0]["error"].startswith("AttributeError")
  assert answers[1]["error"].startswith("TypeError")
  assert all("\n" not in a["error"] for a in answers)
  assert proc.returncode == 0


def test_our_side_on_a_tiny_checkpoint(tmp_path):
  """Our side end to end through `run` (sampling both workloads, two GRPO steps), with
  the peers absent: the result says so and the render has no traceback."""
  from benchmarks.common import random_checkpoint  # pylint: disable=g-import-not-at-top

  shape = dict(peers.QUICK_SHAPE, vocab_size=256, num_hidden_layers=1)
  model = str(tmp_path / "ckpt")
  random_checkpoint.write_qwen3(model, "float32", **shape)
  args = peers.parse_args(["--quick", "--model", model, "--peers-python",
                           str(tmp_path / "no_python")])
  res = peers.run(args, log=lambda _: None)
  assert res["absent"]["tunix"].startswith("no Python at")
  assert res["absent"]["trl"].startswith("no Python at")
  assert set(res["versions"]) == {"ours"} and "jax" in res["versions"]["ours"]
  assert res["packages"][sys.executable]["jax"] == res["versions"]["ours"]["jax"]
  sampling = {s["name"]: s for s in res["sampling"]}
  uniform, rl = sampling["uniform_b4"], sampling["rl_b4"]
  assert uniform["runs"]["ours"][0]["tokens"] == 4 * args.new  # EOS off: every token
  assert uniform["lengths"]["ours"]["capped"] == 1.0
  assert 0 < rl["runs"]["ours"][0]["tokens"] <= 2 * 4 * args.new
  assert uniform["vs"] == {} and res["train"]["vs"] == {}  # nothing to compare against
  assert uniform["runs"]["floor"][0]["tokens"] == 4 * args.new
  assert set(uniform["of_floor"]) == {"ours"} and "floor" not in rl["runs"]
  train = res["train"]
  losses = train["runs"]["ours"][0]["losses"]
  assert len(losses) == args.train_steps and all(abs(x) < 10 for x in losses)
  assert losses[0] != losses[1]  # the update moved the weights
  text = peers.render(res)
  assert "tunix: absent (no Python at" in text and "trl: absent (no Python at" in text
  assert "Traceback" not in text and "not equal" not in text
  assert peer_sides.versions()["python"]


def test_profile_call_shares_the_wall_time_among_the_ops_running():
  """Two ops overlapping on two threads split the overlap; a gap counts as idle; the
  executor's own spans are no op; rows are named by the HLO's op_name."""
  import types
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "peers"))
  from benchmarks.peers import profile_call  # pylint: disable=g-import-not-at-top

  def ev(name, start, end, program="6"):
    return types.SimpleNamespace(name=name, start_ns=start, duration_ns=end - start,
                                 stats=[("program_id", program)])

  ms = 1_000_000
  a = [ev("ThunkExecutor::Execute", 0, 10 * ms), ev("ynn_fusion.3", 0, 4 * ms),
       ev("gather_fusion", 6 * ms, 8 * ms, "4")]
  b = [ev("ynn_fusion.7", 2 * ms, 4 * ms)]
  trace = types.SimpleNamespace(planes=[types.SimpleNamespace(lines=[
      types.SimpleNamespace(name="tf_XLAEigen/1", events=a),
      types.SimpleNamespace(name="tf_XLAEigen/2", events=b),
      types.SimpleNamespace(name="python", events=[ev("device_get", 0, 10 * ms)])])])
  lines = profile_call.wall_split(trace, {("6", "ynn_fusion.3"): "jit(run)/BTD,VD->BTV/dot_general"}, 5)
  assert lines[0].startswith("span 0.01 s, idle (no op running) 0.00 s; per program: 6 0.00 s")
  assert lines[1].split()[:2] == ["0.003", "s"] and lines[1].endswith("BTD,VD->BTV/dot_general")
  # ynn_fusion.3 2 ms alone + half of the 2 ms beside ynn_fusion.7; the gather 2 ms alone.
  assert [ln.split()[0] for ln in lines[1:]] == ["0.003", "0.002", "0.001"]
  assert "program 4" in lines[2] and "gather_fusion" in lines[2] and "ynn_fusion" in lines[3]
