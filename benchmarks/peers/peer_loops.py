"""One side's whole RL loop in a process of its own: ours, Tunix's GRPOLearner, TRL's GRPOTrainer.

    python benchmarks/peers/peer_loops.py ours SPEC.json OUT.json
    /work/peers-venv/bin/python benchmarks/peers/peer_loops.py tunix SPEC.json OUT.json

`loop_compare.py` writes SPEC (the checkpoint, the prompts of every step in order, the
group size, the completion cap, the step count, the optimizer) and runs each side in the
Python that has its packages. Each side runs its library's own loop for `steps` steps
and writes OUT: one row per step with the step's end (seconds since the loop started,
taken by a hook of that library's loop), its reward and pass rate, its completion length
and the phases the library itself times (ours: metrics.jsonl; Tunix: its perf spans;
TRL: its profiling contexts and step_time), plus the seconds to set up and to run.

The reward is the same function on every side: our built-in `arithmetic` verifier (the
reward of `arithmetic/add2`: the final answer is a plain integer equal to the sum),
+1 right and -1 wrong (ours' defaults). The peers import it from this checkout
(`jaxrl_scale.rewards` needs only the standard library and mpmath).

Only the standard library is imported at module level: each side imports its own stack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BASE_CONFIG = os.path.join(ROOT, "configs", "cpu_tiny.yaml")


def ours_overrides(spec: dict) -> list[str]:
  """Our run: configs/cpu_tiny.yaml (our shipped config for this task on a CPU: PipelineRL-2,
  8 simulated devices split 4 + 4, remat off) with the task's shape (P x G sampler slots)
  and the optimizer of the spec; no SFT (the checkpoint is warm-started), no eval, no
  forecast."""
  steps, per_step = len(spec["prompts"]), len(spec["prompts"][0])
  return [
      f"run.steps={steps}", "run.log_every=1", "run.sft_stop_pass_rate=null", "sft.steps=0",
      f"run.seed={spec['seed']}",
      f"model.path={spec['model']}", f"model.tokenizer={spec['model']}",
      "model.num_layers=null", f"data.source={spec['task']}",
      f"data.num_train={steps * per_step}", "data.num_validation=0",
      f"data.max_prompt_tokens={spec['prompt_len']}", f"data.seed={spec['seed']}",
      f"sampler.max_new_tokens={spec['cap']}", f"sampler.temperature={spec['temperature']}",
      f"sampler.prompt_buckets=[{spec['prompt_len']}]",
      # As many slots as a step has completions: the peers' static batch is P x G rows.
      f"sampler.num_slots={per_step * spec['group']}",
      f"rl.prompts_per_step={per_step}", f"rl.generations_per_prompt={spec['group']}",
      f"optim.lr={spec['lr']}", "optim.warmup_steps=0", "optim.schedule=constant",
      f"optim.eps={spec['eps']}", f"optim.weight_decay={spec['weight_decay']}",
      f"optim.max_grad_norm={spec['max_grad_norm']}",
      "eval.every=0", "forecast.enabled=false", f"checkpoint.every={steps}",
  ] + list(spec.get("ours_set", []))


def reward_fn():
  """Our `arithmetic` verifier as +1 / -1 (our RLConfig's reward_correct / incorrect)."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  from jaxrl_scale.rewards import registry  # pylint: disable=g-import-not-at-top

  verdict = registry.get_reward("arithmetic")

  def reward(completions, answer) -> list[float]:
    return [1.0 if getattr(verdict(c, a), "correct", False) else -1.0
            for c, a in zip(completions, answer)]

  return reward


# ---------------------------------------------------------------------------------- ours


def run_ours(spec: dict, workdir: str) -> dict:
  """`python -m jaxrl_scale.train configs/cpu_tiny.yaml OVERRIDES` (what `jaxrl-scale
  train` runs) in a child process; the rows are its metrics.jsonl."""
  run_dir = os.path.join(workdir, "ours_run")
  cmd = [sys.executable, "-m", "jaxrl_scale.train", BASE_CONFIG, *ours_overrides(spec),
         "--output-dir", run_dir, "--overwrite"]
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)  # the run simulates its configured devices itself
  start = time.perf_counter()
  with open(os.path.join(workdir, "ours_train.log"), "w") as log:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
  process_s = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"jaxrl-scale train exited {proc.returncode} (its log: {log.name})")
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    metrics = [json.loads(line) for line in f if line.strip()]
  rows, end = [], 0.0
  for m in metrics:
    if m.get("step", 0) < 1:
      continue
    end += m["time/step_s"]
    rows.append({
        "step": m["step"], "end_s": end, "step_s": m["time/step_s"],
        "reward_mean": m.get("rollout/reward_mean"), "pass_rate": m.get("rollout/pass_rate"),
        "length_mean": m.get("rollout/length_mean"),
        "phases": {k: m[k] for k in ("time/wait_s", "time/train_s", "time/compile_s",
                                     "time/checkpoint_s", "time/eval_s", "gen/score_s",
                                     "gen/idle_frac", "time/trainer_idle_frac")
                   if k in m},
        "group_ids": m.get("rollout/group_ids"),
        "skipped_no_signal": m.get("train/skipped_no_signal")})
  return {"rows": rows, "process_s": process_s, "loop_s": end,
          "command": " ".join(cmd[1:]).replace(ROOT + "/", "")}


# --------------------------------------------------------------------------------- Tunix


def run_tunix(spec: dict, workdir: str) -> dict:
  """GRPOLearner.train over the spec's batches, colocated on one device (actor, rollout and
  reference share one mesh: Tunix's shared-model path), the vanilla rollout engine, its
  perf spans on (`perf/*`, read through its external metrics logger)."""
  sys.path.insert(0, HERE)
  t0 = time.perf_counter()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  from tunix.perf import export as perf_export  # pylint: disable=g-import-not-at-top
  from tunix.perf import metrics as perf_metrics  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  import peer_sides  # pylint: disable=g-import-not-at-top

  side = peer_sides.Tunix()
  side.load(spec["model"])
  role = rl_cluster_lib.Role
  steps = len(spec["prompts"])
  tx = optax.chain(optax.clip_by_global_norm(spec["max_grad_norm"]), optax.adamw(
      spec["lr"], b1=0.9, b2=0.999, eps=spec["eps"], weight_decay=spec["weight_decay"],
      mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))
  cluster_cfg = rl_cluster_lib.ClusterConfig(
      role_to_mesh={role.ACTOR: side.mesh, role.REFERENCE: side.mesh,
                    role.ROLLOUT: side.mesh},
      rollout_engine="vanilla", offload_to_cpu=False,
      training_config=rl_cluster_lib.RLTrainingConfig(
          actor_optimizer=tx, eval_every_n_steps=10**9, max_steps=steps),
      rollout_config=base_rollout.RolloutConfig(
          max_tokens_to_generate=spec["cap"], max_prompt_length=spec["prompt_len"],
          kv_cache_size=spec["prompt_len"] + spec["cap"] + 8,
          temperature=spec["temperature"], top_p=1.0, top_k=None))
  score = reward_fn()
  ends: dict[int, float] = {}
  logged: dict[int, dict] = {}

  def reward(prompts, completions, answer, **_):
    del prompts
    return score(completions, list(answer))

  def record(buffer):  # Tunix logs a step's buffer when the next one starts, or at close
    logged[buffer.global_steps] = {k: v for k, (v, _) in buffer.metrics.items()
                                   if k != "trajectory_ids"}

  with jax.set_mesh(side.mesh):
    cluster = rl_cluster_lib.RLCluster(
        actor=side.model, reference=None, tokenizer=AutoTokenizer.from_pretrained(
            spec["model"]), cluster_config=cluster_cfg,
        perf_config=perf_metrics.PerfMetricsConfig(
            custom_export_fn=perf_export.PerfMetricsExport.from_cluster_config(cluster_cfg)))
    cluster.with_external_metrics_logger(record)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=[reward],
        algo_config=grpo_learner.GRPOConfig(num_generations=spec["group"], beta=0.0))
    # The step's end: when the actor's optimizer step count moves (a hook on its update).
    update = cluster.update_actor

    def timed_update(*a, **k):
      out = update(*a, **k)
      ends[cluster.actor_trainer.train_steps] = time.perf_counter() - start
      return out

    cluster.update_actor = timed_update
    data = [{"prompts": np.asarray([p["prompt"] for p in batch]),
             "answer": np.asarray([p["answer"] for p in batch])} for batch in spec["prompts"]]
    setup_s = time.perf_counter() - t0
    start = time.perf_counter()
    learner.train(data)
    loop_s = time.perf_counter() - start
  rows, prev = [], 0.0
  # A step's rewards are in the buffer of the global step it ran at (k - 1); its perf
  # spans are exported after the step's global step count moved on (buffer k).
  mean = lambda m, key: float(np.mean(m[key])) if key in m else None  # noqa: E731
  for k in range(1, steps + 1):
    m, perf = logged.get(k - 1, {}), logged.get(k, {})
    score_mean, end = mean(m, "rewards/score/mean"), ends.get(k, prev)
    rows.append({
        "step": k, "end_s": end, "step_s": end - prev, "reward_mean": score_mean,
        "pass_rate": (score_mean + 1) / 2 if score_mean is not None else None,
        "length_mean": mean(m, "completions/mean_length"),
        "phases": {key: mean(perf, key) for key in perf if key.startswith("perf/")
                   and "refer" not in key}})
    prev = end
  return {"rows": rows, "setup_s": setup_s, "loop_s": loop_s}


# ----------------------------------------------------------------------------------- TRL


def run_trl(spec: dict, workdir: str) -> dict:
  """GRPOTrainer.train (its path without vLLM) with the spec's batches in order: one
  optimizer step per step on all P x G completions (per_device_train_batch_size = P x G,
  no gradient accumulation), TRL's own timers collected (`profiling/Time taken: ...`,
  which it sends only to wandb / mlflow / trackio, read here from its ProfilingContext)."""
  t0 = time.perf_counter()
  import torch  # pylint: disable=g-import-not-at-top
  from datasets import Dataset  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM, AutoTokenizer  # pylint: disable=g-import-not-at-top
  from transformers import TrainerCallback  # pylint: disable=g-import-not-at-top
  from trl import GRPOConfig, GRPOTrainer  # pylint: disable=g-import-not-at-top
  from trl.extras import profiling  # pylint: disable=g-import-not-at-top

  timers: list[tuple[int, str, float]] = []
  log_metrics = profiling.ProfilingContext._log_metrics  # pylint: disable=protected-access

  def keep(self, duration):
    timers.append((self.step, self.name.split(".", 1)[-1], duration))
    log_metrics(self, duration)

  profiling.ProfilingContext._log_metrics = keep  # pylint: disable=protected-access
  steps, per_step, group = len(spec["prompts"]), len(spec["prompts"][0]), spec["group"]
  score = reward_fn()
  ends: dict[int, float] = {}
  clock = {"start": None}

  class Clock(TrainerCallback):
    def on_train_begin(self, args, state, control, **_):
      clock["start"] = time.perf_counter()

    def on_step_end(self, args, state, control, **_):
      ends[state.global_step] = time.perf_counter() - clock["start"]

  def accuracy(completions, answer, **_):
    return score(completions, answer)

  flat = [p for batch in spec["prompts"] for p in batch]
  args = GRPOConfig(
      output_dir=os.path.join(workdir, "trl_out"), report_to=[], use_cpu=True,
      bf16=False, gradient_checkpointing=False, seed=spec["seed"],
      per_device_train_batch_size=per_step * group, gradient_accumulation_steps=1,
      num_generations=group, max_completion_length=spec["cap"],
      temperature=spec["temperature"], shuffle_dataset=False, max_steps=steps,
      learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
      adam_epsilon=spec["eps"], weight_decay=spec["weight_decay"],
      max_grad_norm=spec["max_grad_norm"], logging_steps=1, save_strategy="no",
      disable_tqdm=True)
  trainer = GRPOTrainer(
      model=AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32),
      reward_funcs=accuracy, args=args, processing_class=AutoTokenizer.from_pretrained(
          spec["model"]), callbacks=[Clock()],
      train_dataset=Dataset.from_dict({"prompt": [p["prompt"] for p in flat],
                                       "answer": [p["answer"] for p in flat]}))
  setup_s = time.perf_counter() - t0
  start = time.perf_counter()
  trainer.train()
  loop_s = time.perf_counter() - start
  logs = {h["step"]: h for h in trainer.state.log_history if "reward" in h}
  rows, prev = [], 0.0
  for k in range(1, steps + 1):
    h, end = logs.get(k, {}), ends.get(k, prev)
    phases = {"step_time": h.get("step_time")}
    for step, name, seconds in timers:
      if step == k - 1:
        phases[name] = phases.get(name, 0.0) + seconds
    rows.append({"step": k, "end_s": end, "step_s": end - prev,
                 "reward_mean": h.get("reward"),
                 "pass_rate": (h["reward"] + 1) / 2 if "reward" in h else None,
                 "length_mean": h.get("completions/mean_length"), "phases": phases})
    prev = end
  return {"rows": rows, "setup_s": setup_s, "loop_s": loop_s,
          "torch_threads": torch.get_num_threads()}


RUNNERS = {"ours": run_ours, "tunix": run_tunix, "trl": run_trl}


def main(argv: list[str]) -> int:
  if len(argv) != 3 or argv[0] not in RUNNERS:
    print(f"usage: peer_loops.py {{{','.join(RUNNERS)}}} SPEC.json OUT.json", file=sys.stderr)
    return 2
  name, spec_path, out_path = argv
  with open(spec_path) as f:
    spec = json.load(f)
  start = time.perf_counter()
  try:
    out = RUNNERS[name](spec, tempfile.mkdtemp(prefix=f"loop_{name}_",
                                               dir=spec.get("workdir")))
    out["ok"] = True
  except Exception as e:  # pylint: disable=broad-except
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exc()
    text = str(e).strip().splitlines()
    out = {"ok": False, "error": f"{type(e).__name__}: {text[0][:300] if text else ''}"}
  out["wall_s"] = time.perf_counter() - start
  with open(out_path, "w") as f:
    json.dump(out, f)
  return 0 if out["ok"] else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
