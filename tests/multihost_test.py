"""Multi-host runs: 2 JAX processes x 4 simulated CPU devices through `jaxrl-scale train`
end to end (PipelineRL with a checkpoint and a resume; sync mode stopped by a signal to one
process), plus unit tests of the pieces a multi-process run adds.

The end-to-end tests launch `python -m jaxrl_scale.train` twice per run (process 0 and 1)
with JAXRL_COORDINATOR / JAXRL_NUM_PROCESSES / JAXRL_PROCESS_ID on a localhost port, the
run directory on the local (shared) filesystem. Every launch has a deadline: a deadlock
fails the test with both processes' output tails instead of hanging CI.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_scale import checkpoint
from jaxrl_scale import eval as eval_lib
from jaxrl_scale import metrics
from jaxrl_scale.config import MeshConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.parallel import distributed
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.parallel import transfer
from jaxrl_scale.pipeline import loop as loop_lib
from jaxrl_scale.pipeline import sources
from jaxrl_scale.pipeline import wiring
from jaxrl_scale.rl import train_step

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 300


# ---------------------------------------------------------------------------------------
# Unit tests (one process).


def test_process_shard_splits_prompts_disjointly_and_covers_them():
  ids = [f"p{i}" for i in range(400)]
  shards = [sources.ProcessShard(i, 3) for i in range(3)]
  owners = [[s.owns(i) for s in shards] for i in ids]
  assert all(sum(o) == 1 for o in owners)  # every prompt has exactly one process
  sizes = [sum(o[i] for o in owners) for i in range(3)]
  assert min(sizes) > 100  # roughly even
  assert sources.ProcessShard().owns("anything")
  assert sources.ProcessShard(0, 1).keep_hook(None) is None


def test_process_shard_keep_hook_combines_with_the_curriculum():
  shard = sources.ProcessShard(1, 2)
  retired = {"p3"}
  hook = shard.keep_hook(lambda pid: pid not in retired)
  for pid in (f"p{i}" for i in range(50)):
    assert hook(pid) == (shard.owns(pid) and pid not in retired)


def test_process_shard_share_and_seeds():
  assert sources.ProcessShard(0, 4).share(8) == 2
  with pytest.raises(UserError, match="rl.prompts_per_step.*6 does not split evenly over 4"):
    sources.ProcessShard(1, 4).share(6)
  seeds = [sources.ProcessShard(i, 4).seed(7) for i in range(4)]
  assert seeds[0] == 7 and len(set(seeds)) == 4
  assert sources.ProcessShard(2, 4).seed(7) == seeds[2]  # stable: resume draws the same


def _fake_devices(processes, per_process):
  return [types.SimpleNamespace(id=p * 1000 + i, process_index=p)
          for p in range(processes) for i in range(per_process)]


def test_split_by_process_gives_every_process_both_roles():
  devices = _fake_devices(2, 4)
  cfg = MeshConfig(trainer_devices=4, generator_devices=4)
  trainer, gen0 = mesh_lib.split_by_process(cfg, devices, 0)
  _, gen1 = mesh_lib.split_by_process(cfg, devices, 1)
  assert [d.id for d in trainer] == [0, 1, 1000, 1001]  # process-major
  assert [d.id for d in gen0] == [2, 3] and [d.id for d in gen1] == [1002, 1003]
  # Fractions count all devices of the job.
  trainer, gen = mesh_lib.split_by_process(MeshConfig(trainer_devices=0.25,
                                                      generator_devices=0.75), devices, 1)
  assert [d.id for d in trainer] == [0, 1000] and [d.id for d in gen] == [1001, 1002, 1003]
  trainer, gen = mesh_lib.split_by_process(MeshConfig(colocated=True), devices, 1)
  assert len(trainer) == 8 and [d.id for d in gen] == [1000, 1001, 1002, 1003]


@pytest.mark.parametrize("cfg,fragment", [
    (MeshConfig(trainer_devices=3, generator_devices=4), "'mesh.trainer_devices': 3 devices do "
     "not split evenly over 2 processes"),
    (MeshConfig(trainer_devices=6, generator_devices=4), "ask each of the 2 processes for 3 + 2"),
])
def test_split_by_process_errors_are_one_line(cfg, fragment):
  with pytest.raises(UserError) as info:
    mesh_lib.split_by_process(cfg, _fake_devices(2, 4), 0)
  assert fragment in str(info.value) and "\n" not in str(info.value)


def test_slices_count_every_process_generator_devices():
  slices = mesh_lib.make_slices(MeshConfig(trainer_devices=4, generator_devices=2))
  assert slices.num_devices == 6
  import dataclasses
  assert dataclasses.replace(slices, num_processes=2).num_devices == 4 + 2 * 2


def test_put_global_places_the_same_values_as_device_put():
  mesh = mesh_lib.make_slices(MeshConfig(trainer_devices=4, generator_devices=4)).trainer
  sharding = NamedSharding(mesh, PartitionSpec("fsdp"))
  batch = {"a": np.arange(32, dtype=np.int32).reshape(8, 4),
           "b": np.linspace(0, 1, 8, dtype=np.float32)}
  shardings = {"a": sharding, "b": sharding}
  placed = train_step.put_global(batch, shardings)
  for k in batch:
    np.testing.assert_array_equal(np.asarray(placed[k]), batch[k])
    assert placed[k].sharding == sharding


def test_to_local_passes_local_arrays_through_and_casts():
  x = jax.numpy.arange(6.0)
  tree = {"w": x}
  assert transfer.to_local(tree)["w"] is x
  out = transfer.to_local(tree, {"w": jax.numpy.bfloat16})
  assert out["w"].dtype == jax.numpy.bfloat16


def test_allgather_and_barrier_in_one_process():
  assert distributed.allgather({"a": 1}) == [{"a": 1}]
  distributed.barrier("single")  # a no-op


def test_combine_metrics_adds_throughput_and_keeps_maxima():
  rows = [{"gen/tokens_per_s": 10.0, "gen/idle_frac": 0.2, "queue/groups": 1.0,
           "staleness/queued_max": 1.0, "staleness/queued_count": 2.0,
           "pipeline/dropped_stale": 1.0},
          {"gen/tokens_per_s": 30.0, "gen/idle_frac": 0.4, "queue/groups": 3.0,
           "staleness/queued_max": 2.0, "staleness/queued_count": 1.0,
           "pipeline/dropped_stale": 0.0}]
  assert loop_lib.combine_metrics(rows) == pytest.approx({
      "gen/tokens_per_s": 40.0, "gen/idle_frac": 0.3, "queue/groups": 4.0,
      "staleness/queued_max": 2.0, "staleness/queued_count": 3.0,
      "pipeline/dropped_stale": 1.0})


class _Source:

  def __init__(self, groups=None, error=None):
    self.groups, self.error, self.calls = groups, error, 0

  def next_groups(self, step):
    self.calls += 1
    if self.error is not None:
      raise self.error
    return self.groups


class _Progress:

  def __init__(self):
    self.lines = []

  def print(self, text):
    self.lines.append(text)


def _loop(source, others, own_signal=None):
  """A Loop with only what `_next_groups` touches; `others` are the other processes'
  payloads, appended after this process's (process 0) in the fake exchange."""
  loop = loop_lib.Loop.__new__(loop_lib.Loop)
  loop.source, loop.progress, loop._signal = source, _Progress(), own_signal
  sent = []

  def gather(payload, name):
    sent.append((name, payload))
    return [payload, *others]

  loop.gather = gather
  return loop, sent


def _payload(groups=None, sig=None, error=None):
  return {"signal": sig, "error": error, "groups": groups}


def test_exchange_gives_every_process_all_groups_in_process_order():
  loop, sent = _loop(_Source(groups=["a0", "a1"]), [_payload(groups=["b0", "b1"])])
  local, groups = loop._next_groups(3)
  assert local == ["a0", "a1"] and groups == ["a0", "a1", "b0", "b1"]
  assert sent == [("groups", _payload(groups=["a0", "a1"]))]


def test_a_signal_on_another_process_stops_this_one_at_the_same_step():
  loop, _ = _loop(_Source(groups=["a0"]), [_payload(sig=signal.SIGTERM)])
  assert loop._next_groups(3) is None
  assert loop._signal == signal.SIGTERM
  assert "another process received SIGTERM" in loop.progress.lines[0]


def test_a_signal_here_is_sent_instead_of_waiting_for_rollouts():
  source = _Source(groups=["a0"])
  loop, sent = _loop(source, [_payload(groups=["b0"])], own_signal=signal.SIGINT)
  assert loop._next_groups(3) is None
  assert source.calls == 0 and sent[0][1]["signal"] == signal.SIGINT


def test_a_failure_anywhere_raises_everywhere():
  loop, _ = _loop(_Source(groups=["a0"]), [_payload(error="GeneratorError: boom")])
  with pytest.raises(loop_lib.ProcessFailed, match="process 1 failed at step 4: .*boom"):
    loop._next_groups(3)
  # This process's own failure is sent to the others first, then raised here.
  loop, sent = _loop(_Source(error=ValueError("bad verifier")), [_payload(groups=["b0"])])
  with pytest.raises(ValueError, match="bad verifier"):
    loop._next_groups(3)
  assert sent[0][1]["error"] == "ValueError: bad verifier"


def test_process_source_state_picks_this_process_part():
  parts = {"processes": [{"next_seq": 3}, {"next_seq": 5}]}
  assert wiring.process_source_state(parts, sources.ProcessShard(1, 2), "ck") == {
      "next_seq": 5}
  assert wiring.process_source_state({"next_seq": 2}, sources.ProcessShard(), "ck") == {
      "next_seq": 2}
  with pytest.raises(UserError, match="written by 2 process.*this run has 1"):
    wiring.process_source_state(parts, sources.ProcessShard(), "ck")
  with pytest.raises(UserError, match="written by 1 process.*this run has 2"):
    wiring.process_source_state({"next_seq": 2}, sources.ProcessShard(0, 2), "ck")


class _EvalSampler:
  """Prompt i's sample j is correct when j < i % 3; tokens: i + 1."""

  version = 0

  def update_params(self, params, version):
    pass

  def generate(self, requests):
    from jaxrl_scale.generation import records
    return [records.Completion(
        prompt_id=r.prompt_id, sample_index=r.sample_index, prompt_tokens=np.zeros(1, np.int32),
        tokens=np.full((r.prompt_id + 1,), 1 if r.sample_index < r.prompt_id % 3 else 0,
                       np.int32),
        logprobs=np.zeros(r.prompt_id + 1, np.float32),
        versions=np.zeros(r.prompt_id + 1, np.int32), forced=np.zeros(r.prompt_id + 1, bool),
        finish_reason="eos", truncated=r.prompt_id == 4) for r in requests]


class _EvalScorer:

  def score(self, prompt, completions):
    correct = np.array([c.tokens[0] == 1 for c in completions])
    return np.where(correct, 1.0, -1.0), correct, {}


def test_sharded_eval_equals_the_unsharded_one():
  from jaxrl_scale.data import sources as data_sources
  prompts = [data_sources.Prompt(id=str(i), task="arithmetic", prompt="", text="",
                                 token_ids=(1,), answer="", solution="") for i in range(7)]
  kwargs = dict(samples_per_prompt=3, temperature=1.0, seed=1)
  whole = eval_lib.Evaluator(_EvalSampler(), prompts, _EvalScorer(), **kwargs).run()
  parts, seen = {}, []

  class _Sampler(_EvalSampler):

    def generate(self, requests):
      seen.extend((r.prompt_id, r.seed) for r in requests)
      return super().generate(requests)

  # Process 1 runs its share first and hands its counts to process 0's gather.
  one = eval_lib.Evaluator(_Sampler(), prompts, _EvalScorer(), shard=(1, 2),
                           gather=lambda c: parts.setdefault("one", c) and [c], **kwargs)
  one.run()
  zero = eval_lib.Evaluator(_Sampler(), prompts, _EvalScorer(), shard=(0, 2),
                            gather=lambda c: [c, parts["one"]], **kwargs)
  combined = zero.run()
  for key in ("val/pass_rate", "val/pass_at_k", "val/length_mean", "val/truncated_frac",
              "val/num_prompts"):
    assert combined[key] == pytest.approx(whole[key]), key
  assert sorted(p for p, _ in seen) == sorted(i for i in range(7) for _ in range(3))
  with pytest.raises(ValueError, match="needs `gather`"):
    eval_lib.Evaluator(_EvalSampler(), prompts, _EvalScorer(), shard=(0, 2), **kwargs)


def test_null_metrics_writer_writes_nothing(tmp_path):
  with metrics.NullMetricsWriter(tmp_path) as w:
    w.write(1, {"compute_hours": 0.0})
    with pytest.raises(ValueError, match="compute_hours"):
      w.write(2, {})
  assert not (tmp_path / "metrics.jsonl").exists()


def test_checkpointer_accepts_a_url_directory():
  path = checkpoint._directory("gs://bucket/run/checkpoints")  # pylint: disable=protected-access
  assert str(path) == "gs://bucket/run/checkpoints"
  assert checkpoint._directory("rel/dir").is_absolute()  # pylint: disable=protected-access


def test_train_refuses_a_url_run_directory():
  from jaxrl_scale import train
  parser = __import__("argparse").ArgumentParser()
  train.add_arguments(parser)
  args = parser.parse_args([str(ROOT / "configs" / "cpu_tiny.yaml"), "run.steps=1",
                            "--output-dir", "gs://bucket/run"])
  with pytest.raises(UserError, match="run.output_dir.*is a URL"):
    train.run(args)


# ---------------------------------------------------------------------------------------
# Two processes end to end.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _write_task(path: pathlib.Path) -> None:
  """Prompts 'N:' answered by N mod 2 (as in train_test): a few SFT steps give reward
  variance, so RL steps train."""
  with open(path, "w") as f:
    for i in range(80):
      a = str(i % 2)
      f.write(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": a, "solution": a}) + "\n")


def _overrides(data: pathlib.Path, steps: int) -> list[str]:
  return [
      f"run.steps={steps}", "run.tensorboard=false", "run.progress=true",
      "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64",
      f"data.source={data}", "data.task=arithmetic", "data.id_field=id",
      "data.solution_field=solution", "data.num_validation=8", "data.max_prompt_tokens=8",
      "sft.steps=15", "sft.lr=1e-2", "sft.batch_size=16",
      # An unreachable target: the sharded dev-set check runs 3 times in both processes.
      "run.sft_stop_pass_rate=1.0", "run.sft_dev_prompts=8", "run.sft_check_every=5",
      "rl.prompts_per_step=4", "rl.generations_per_prompt=4", "optim.lr=1e-3",
      "optim.warmup_steps=0", "sampler.num_slots=16", "sampler.max_new_tokens=4",
      "sampler.decode_chunk=4", "sampler.prompt_buckets=[8]",
      "eval.every=2", "eval.samples_per_prompt=2", "checkpoint.every=2",
      "checkpoint.async_save=false", "forecast.n_boot=0", "pipeline.max_staleness=2",
      # 4 devices per process: 2 trainer + 2 generator each; the trainer mesh spans both.
      "mesh.simulated_cpu_devices=4", "mesh.trainer_devices=4", "mesh.generator_devices=4",
  ]


class _Job:
  """Two `jaxrl_scale.train` processes of one multi-process run."""

  def __init__(self, run_dir, data, cache, steps, *extra):
    port = _free_port()
    self.logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
    self.procs = []
    for pid in range(2):
      env = dict(os.environ, JAX_PLATFORMS="cpu", JAXRL_COORDINATOR=f"127.0.0.1:{port}",
                 JAXRL_NUM_PROCESSES="2", JAXRL_PROCESS_ID=str(pid),
                 JAX_COMPILATION_CACHE_DIR=cache,
                 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", PYTHONUNBUFFERED="1")
      env.pop("XLA_FLAGS", None)  # the command simulates its own 4 devices per process
      env.pop("JAXRL_DISTRIBUTED", None)
      cmd = [sys.executable, "-m", "jaxrl_scale.train", str(ROOT / "configs" / "cpu_tiny.yaml"),
             *_overrides(data, steps), *extra, "--output-dir", str(run_dir)]
      self.procs.append(subprocess.Popen(cmd, env=env, stdout=self.logs[pid],
                                         stderr=subprocess.STDOUT, text=True))

  def output(self, pid: int) -> str:
    self.logs[pid].seek(0)
    return self.logs[pid].read()

  def tails(self) -> str:
    return "\n".join(f"--- process {pid} (exit {p.poll()}) ---\n{self.output(pid)[-3000:]}"
                     for pid, p in enumerate(self.procs))

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()
    for p in self.procs:
      p.wait()

  def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> list[str]:
    """Waits for both; on a deadline or a failure kills both and fails with their output."""
    deadline = time.monotonic() + timeout
    try:
      while any(p.poll() is None for p in self.procs):
        if time.monotonic() > deadline:
          self.kill()
          pytest.fail(f"2-process run still running after {timeout:.0f} s (deadlock?):\n"
                      f"{self.tails()}")
        if any(p.poll() not in (None, 0) for p in self.procs):
          time.sleep(5)  # give the other a moment to fail too, for its message
          self.kill()
          break
        time.sleep(0.2)
    finally:
      self.kill()
    codes = [p.returncode for p in self.procs]
    assert codes == [0, 0], self.tails()
    return [self.output(pid) for pid in range(2)]


def _rows(run_dir):
  return metrics.read_metrics(pathlib.Path(run_dir) / "metrics.jsonl")


def _progress_lines(text: str) -> list[str]:
  return [l for l in text.splitlines()
          if l.startswith(("step ", "jaxrl-scale train ", "  sft ", "finished "))]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "parity.jsonl"
  _write_task(path)
  return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.mark.slow  # 42 s of the default run; the other multihost tests stay in it
@pytest.mark.multihost
def test_two_processes_pipeline_run_checkpoint_and_resume(task_file, cache, tmp_path):
  run_dir = tmp_path / "run"
  first = _Job(run_dir, task_file, cache, 4, "pipeline.mode=pipeline").wait()
  rows = _rows(run_dir)
  assert [r["step"] for r in rows] == list(range(5))
  with checkpoint.Checkpointer(run_dir / "checkpoints") as ckpt:
    assert ckpt.all_steps() == [0, 2, 4]
    host4 = json.loads((run_dir / "checkpoints" / "4" / "host" / "metadata").read_text())
    updates4 = int(ckpt.read_arrays(4)["step"])
  # Both processes' data positions, each in its own slot.
  assert len(host4["source"]["processes"]) == 2
  assert host4["step"] == host4["policy_version"] == 4

  second = _Job(run_dir, task_file, cache, 6, "pipeline.mode=pipeline").wait()
  assert "resumed from checkpoint step 4" in second[0]
  rows = _rows(run_dir)
  steps = [r["step"] for r in rows]
  assert steps == list(range(7)), steps  # no gap, no duplicate across the resume
  assert all("step" in r and r["compute_hours"] is not None for r in rows)
  hours = [r["compute_hours"] for r in rows]
  assert all(b >= a for a, b in zip(hours, hours[1:]))  # compute continues from the checkpoint
  assert any("train/loss" in r for r in rows[1:]), "no step trained"
  assert all(r["staleness/max"] <= 2 for r in rows[1:])
  assert all("val/pass_rate" in r for r in rows if r["step"] % 2 == 0)
  with checkpoint.Checkpointer(run_dir / "checkpoints") as ckpt:
    assert ckpt.all_steps() == [2, 4, 6]
    updates6 = int(ckpt.read_arrays(6)["step"])
  host6 = json.loads((run_dir / "checkpoints" / "6" / "host" / "metadata").read_text())
  assert host6["step"] == host6["policy_version"] == 6
  assert updates4 <= updates6 <= updates4 + 2  # the optimizer's count went on from step 4
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["outcome"] == "done" and summary["steps"] == 6
  # One writer: process 0 printed the progress, process 1 nothing of it.
  for out in (first, second):
    assert _progress_lines(out[0]) and not _progress_lines(out[1]), out[1][-2000:]
    assert "process 0/2, 8 devices (4 local, cpu)" in out[0]


def _wait_for_step(run_dir, step, job, timeout=LAUNCH_TIMEOUT_S):
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if any(p.poll() is not None for p in job.procs):
      job.kill()
      pytest.fail(f"a process exited early:\n{job.tails()}")
    if path.exists() and any(json.loads(line).get("step") == step
                             for line in path.read_text().splitlines() if line.endswith("}")):
      return
    time.sleep(0.1)
  job.kill()
  pytest.fail(f"step {step} not reached in {timeout}s:\n{job.tails()}")


@pytest.mark.multihost
@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_with_a_checkpoint(task_file, cache, tmp_path):
  run_dir = tmp_path / "run"
  job = _Job(run_dir, task_file, cache, 40, "pipeline.mode=sync", "checkpoint.every=0")
  _wait_for_step(run_dir, 2, job)
  job.procs[1].send_signal(signal.SIGTERM)  # only process 1 hears it
  out = job.wait()
  assert "another process received SIGTERM" in out[0]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["outcome"] == "signal" and summary["steps"] < 40
  with checkpoint.Checkpointer(run_dir / "checkpoints") as ckpt:
    assert ckpt.latest_step() == summary["steps"]  # saved on the signal, by both
  assert [r["step"] for r in _rows(run_dir)] == list(range(summary["steps"] + 1))
