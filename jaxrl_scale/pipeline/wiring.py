"""Builds one run from a config and runs it (what `jaxrl-scale train` calls).

Order: trainer / generator slices -> tokenizer -> prompts -> policy -> verifiers and sampler
-> SFT warm start (fresh runs) -> RL trainer -> checkpoint restore (resumed runs) -> the
mode's rollout source -> metrics stream, checkpointer, live forecaster -> `loop.Loop`.
The caller must already have started `jax.distributed` (`parallel.distributed`) and asked
for simulated CPU devices (`parallel.mesh`).

Several processes: the trainer mesh spans all of them, each process samples on its own
generator slice with its own source (`sources.ProcessShard`: a disjoint share of the
prompts, P / processes groups per step, its own seeds) and evaluates its share of the
validation prompts; `loop.Loop` exchanges the groups so every process trains the same
batch. Process 0 alone writes config.yaml, metrics.jsonl, TensorBoard, progress,
summary.json and the forecast; checkpoints are written by all (orbax).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import pathlib
import tempfile
import time
from typing import Any, TextIO

import jax
import numpy as np
import yaml
from flax import nnx

from jaxrl_scale import checkpoint as checkpoint_lib
from jaxrl_scale import config as config_lib
from jaxrl_scale import eval as eval_lib
from jaxrl_scale import metrics as metrics_lib
from jaxrl_scale import preempt
from jaxrl_scale.config import Config
from jaxrl_scale.data import mixture
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import hf_io
from jaxrl_scale.models import sharding
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.parallel import distributed
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.pipeline import clock as clock_lib
from jaxrl_scale.pipeline import environment
from jaxrl_scale.pipeline import generator
from jaxrl_scale.pipeline import loop as loop_lib
from jaxrl_scale.pipeline import progress as progress_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.pipeline import sources
from jaxrl_scale.pipeline import summary as summary_lib
from jaxrl_scale.pipeline import warm_start
from jaxrl_scale.rl import advantages as advantages_lib
from jaxrl_scale.rl import curriculum as curriculum_lib
from jaxrl_scale.rl import placement
from jaxrl_scale.rl import train_step

log = logging.getLogger(__name__)

# Above this many parameters a random init runs sharded under jit instead of in NumPy on
# the host (which is faster for small models but materialises every weight once).
_HOST_INIT_MAX_PARAMS = 100_000_000


# ---- policy ---------------------------------------------------------------------------------


def model_config_for(cfg: Config, tok: tokenizer_lib.Tokenizer | None
                     ) -> model_config.ModelConfig:
  """The preset named by model.preset with the spec's dtype and shape overrides (checked
  against the tokenizer's vocabulary when one is given)."""
  spec = cfg.model
  changes: dict[str, Any] = dict(dtype=spec.dtype, param_dtype=spec.param_dtype,
                                 lm_head_fp32=spec.lm_head_fp32,
                                 attention_impl=spec.attention_impl)
  for key in ("hidden_size", "num_layers", "intermediate_size"):
    if getattr(spec, key) is not None:
      changes[key] = getattr(spec, key)
  try:
    mcfg = dataclasses.replace(model_config.preset(spec.preset), **changes)
  except ValueError as e:
    raise UserError(f"config key 'model': {e}") from None
  if tok is not None and mcfg.vocab_size < tok.vocab_size:
    raise UserError(f"config key 'model.preset': {spec.preset} has vocab_size "
                    f"{mcfg.vocab_size}, smaller than the tokenizer's {tok.vocab_size}")
  return mcfg


def policy_config(cfg: Config) -> model_config.ModelConfig:
  """The policy's ModelConfig without its weights: model.path's config.json (with the spec's
  dtypes and switches, as `build_policy` loads it) or the preset."""
  spec = cfg.model
  if spec.path is not None:
    return hf_io.read_model_config(spec.path, dtype=spec.dtype, param_dtype=spec.param_dtype,
                                   lm_head_fp32=spec.lm_head_fp32,
                                   attention_impl=spec.attention_impl)
  return model_config_for(cfg, None)


def _host_init(mcfg: model_config.ModelConfig, mesh, seed: int, std: float) -> nnx.Module:
  """Random params drawn in NumPy and placed sharded (XLA-compiling a random init of a tiny
  model costs more than the whole SFT warm start on a small CPU)."""
  graphdef, abstract = sharding.abstract_model(mcfg)
  rng = np.random.default_rng(seed)

  def one(path, x):
    value = x.get_value()
    name = getattr(path[-1], "key", None)
    if name == "scale":  # RMSNorm scales start at 1
      arr = np.ones(value.shape)
    elif name == "bias":
      arr = np.zeros(value.shape)
    else:
      arr = std * rng.standard_normal(value.shape)
    return x.replace(arr.astype(value.dtype))

  state = jax.tree.map_with_path(one, abstract, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))


def build_policy(cfg: Config, tok: tokenizer_lib.Tokenizer, mesh, *, weights: bool = True
                 ) -> tuple[nnx.Module, model_config.ModelConfig]:
  """The policy on the trainer mesh: a Hugging Face directory or a randomly initialised preset.

  weights=False (a resumed run, whose checkpoint overwrites every param): model.path's
  shape only, randomly initialised, without reading its weights (minutes for a large one).
  """
  spec = cfg.model
  if spec.path is not None and weights:
    return hf_io.load_hf_model(spec.path, mesh, param_dtype=spec.param_dtype, dtype=spec.dtype,
                               lm_head_fp32=spec.lm_head_fp32,
                               attention_impl=spec.attention_impl)
  mcfg = policy_config(cfg) if spec.path is not None else model_config_for(cfg, tok)
  if mcfg.num_params() <= _HOST_INIT_MAX_PARAMS:
    return _host_init(mcfg, mesh, cfg.run.seed, spec.init_std), mcfg
  return sharding.create_sharded_model(mcfg, mesh, seed=cfg.run.seed), mcfg


def rl_objective(cfg: Config) -> train_step.RLObjective:
  """The run's policy loss, at the temperature its sampler draws with."""
  return train_step.RLObjective(cfg.rl, temperature=cfg.sampler.temperature,
                                replay_routing=cfg.model.routing == "replay")


def check_objective(cfg: Config) -> None:
  """Stops on an unknown rl.loss, rl.aggregation or rl.advantage_norm, or a bad loss setting,
  with one line naming it. `train` calls it before it writes or computes anything: the
  trainer would first read them after the warm start, and the first batch the last."""
  rl_objective(cfg)
  advantages_lib.get_normalization(cfg.rl.advantage_norm)


def load_tokenizer(cfg: Config) -> tokenizer_lib.Tokenizer:
  spec = cfg.model.tokenizer
  if spec == "byte" and cfg.model.path is not None:
    spec = cfg.model.path  # a checkpoint directory brings its own tokenizer
  return tokenizer_lib.load_tokenizer(spec)


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)


def restore(ckpt: checkpoint_lib.Checkpointer, trainer: train_step.Trainer,
            shard: sources.ProcessShard | None = None) -> loop_lib.HostState:
  """Loads the newest readable checkpoint into `trainer`; returns the host state.

  The host state's `source` is this process's own data position (a multi-process
  checkpoint holds one per process, see `loop.Loop.save`).
  """
  try:
    step, state, host = ckpt.restore(_abstract(trainer.state))
  except UserError as e:
    if "do not match" in str(e) or "structure" in str(e):
      raise UserError(f"{e} -- the checkpoints do not fit this config (did the model or the "
                      "optimizer settings change?); use --overwrite to start afresh") from None
    raise
  trainer.state = state
  state_host = loop_lib.HostState.from_json(host, f"{ckpt.directory}/{step}")
  state_host.source = process_source_state(state_host.source, shard or sources.ProcessShard(),
                                           f"{ckpt.directory}/{step}")
  return state_host


def process_source_state(source: dict[str, Any], shard: sources.ProcessShard,
                         origin: str) -> dict[str, Any]:
  """This process's part of a checkpoint's source state."""
  parts = source.get("processes") if isinstance(source, dict) else None
  written = len(parts) if parts is not None else 1
  if written != shard.count:
    raise UserError(f"{origin}: the checkpoint was written by {written} process(es), this run "
                    f"has {shard.count}; resume with the same number of processes")
  return parts[shard.index] if parts is not None else source


# ---- the run --------------------------------------------------------------------------------


def _make_source(cfg: Config, sampler: engine.Sampler, admitter: sources.Admitter,
                 scorer: rollouts.GroupScorer, pool, p: int,
                 stop: preempt.StopRequest | None = None, colocated: bool = False) -> Any:
  """The mode's rollout source, producing `p` groups per step (this process's share)."""
  mode = cfg.pipeline.mode
  if mode == "pipeline":
    return generator.PipelineSource(
        sampler, admitter, scorer, num_prompts=p, max_staleness=cfg.pipeline.max_staleness,
        queue_size=cfg.pipeline.queue_size, reward_workers=cfg.pipeline.reward_workers)
  rounds = max(1, cfg.pipeline.max_staleness) if mode == "ppo_offpolicy" else 1
  return sources.RoundSource(sampler, admitter, scorer, p, rounds=rounds, pool=pool, stop=stop,
                             sleep=colocated and cfg.sampler.sleep_while_training)


def signal_name(stop: preempt.StopRequest) -> str:
  import signal  # pylint: disable=g-import-not-at-top
  return signal.Signals(stop.signum or signal.SIGTERM).name


def _replay_forecast(forecaster: Any, metrics_path: pathlib.Path, before_step: int) -> None:
  """Feeds the eval points of the kept metrics rows back into a fresh forecaster."""
  if not metrics_path.exists():
    return
  column = forecaster.column
  for row in metrics_lib.read_metrics(metrics_path):
    if row.get("step", before_step) < before_step and row.get("val/pass_rate") is not None:
      x, hours = row[column], row["compute_hours"]
      forecaster.update(x, row["val/pass_rate"], step=row["step"], hours=hours,
                        eval_size=row.get("val/num_prompts", float("nan"))
                        * row.get("val/samples_per_prompt", float("nan")))
      forecaster.update_domains(x, row, step=row["step"], hours=hours)


def _run(cfg: Config, run_dir: pathlib.Path, resume: bool, cleanup: contextlib.ExitStack,
         slices: mesh_lib.Slices, tok: tokenizer_lib.Tokenizer,
         prompts: data_sources.PromptSource | mixture.MixedSource, validation: list,
         model: nnx.Module, mcfg: model_config.ModelConfig, shape: rollouts.BatchShape,
         progress: progress_lib.Progress, on_step, stop: preempt.StopRequest,
         on_loop=None) -> tuple[loop_lib.Outcome, Any, Any]:
  """Everything after the policy exists: warm start or restore, then the loop."""
  from jaxrl_scale.scaling import live  # pylint: disable=g-import-not-at-top

  p, g = shape.num_prompts, shape.group_size
  seq_len = shape.seq_len
  shard = sources.ProcessShard(jax.process_index(), jax.process_count())
  multi = shard.count > 1
  gather = distributed.allgather if multi else None
  local_p = shard.share(p)
  ckpt = cleanup.enter_context(checkpoint_lib.Checkpointer(
      run_dir / "checkpoints", keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save))
  pool = concurrent.futures.ThreadPoolExecutor(cfg.pipeline.reward_workers,
                                               thread_name_prefix="verify")
  cleanup.callback(pool.shutdown, wait=False, cancel_futures=True)
  scorer = rollouts.GroupScorer(cfg.rl, tok, num_threads=cfg.pipeline.reward_workers,
                                timeout_s=cfg.pipeline.reward_timeout_s)
  cleanup.callback(scorer.close)
  # Built before the warm start, which samples with it; it gets the trained weights below.
  # The process's one Sampler (training rollouts, SFT dev checks and eval all use it), with
  # this host's share of the job's sampler.num_slots.
  sampler = engine.Sampler(model, cfg.sampler, mesh=slices.generator, tokenizer=tok,
                           seed=cfg.run.seed, max_prompt_len=cfg.data.max_prompt_tokens,
                           generator_groups=slices.generator_groups,
                           record_routing=cfg.model.routing != "own",
                           env_workers=cfg.env.workers)
  episode_for = environment.episodes(cfg, tok)  # None: single-turn
  benches = None  # benchmark pass@k on eval steps: the files are read before the warm start
  if cfg.eval.every and validation and cfg.eval.downstream_every:
    from jaxrl_scale.downstream import training as downstream  # pylint: disable=g-import-not-at-top
    benches = downstream.read_benchmarks(cfg, tok, processes=shard.count)
  # Driven from this thread (sync modes, evals, SFT checks): stops at a chunk on SIGTERM.
  interruptible = preempt.Interruptible(sampler, stop)
  host = loop_lib.HostState(seed=cfg.run.seed)
  warm_dir = run_dir / "warm_start"  # an interrupted warm start's state
  if not resume and cfg.sft.steps > 0:
    # Every process runs the same SFT steps; only process 0's sft.jsonl is kept.
    sft_dir = run_dir if distributed.is_primary() else pathlib.Path(
        cleanup.enter_context(tempfile.TemporaryDirectory(prefix="jaxrl_sft_")))
    # Its dev-set checks are sharded like the eval, so every process stops at the same step.
    try:
      model, host.sft_compute_hours, _ = warm_start.run(
          cfg, tok, model, slices.trainer, seq_len, sft_dir, progress, sampler=sampler,
          scorer=scorer, pool=pool, shard=(shard.index, shard.count),
          gather=(lambda c: distributed.allgather(c, name="sft_dev")) if multi else None,
          stop=stop, state_dir=warm_dir, agree=(lambda flag: any(distributed.allgather(
              flag, name="sft_stop"))) if multi else None,
          sleep=slices.colocated and cfg.sampler.sleep_while_training,
          episode_for=episode_for)
    except preempt.Interrupted:
      return loop_lib.Outcome("signal", 0, signal_name(stop)), None, host
  asked = train_step.micro_batches_for(cfg.optim, p)
  micro = train_step.micro_batches_for(cfg.optim, p, g, slices.trainer)
  note = placement.micro_batch_note("optim.micro_batch_prompts", p, g, asked, micro,
                                     slices.trainer)
  if note:
    progress.print(f"  note: {note}")
  trainer = train_step.Trainer(model, slices.trainer, cfg.optim, rl_objective(cfg),
                               micro_batches=micro)
  del model  # its buffers now belong to the trainer (donated to every step)
  if resume:
    host = restore(ckpt, trainer, shard)
    progress.print(f"  resumed from checkpoint step {host.step} "
                   f"({host.compute_hours:.4g} accelerator-hours so far)")
  sampler.update_params(trainer.params, host.policy_version)

  curriculum = None
  if cfg.rl.no_positive_resampling:
    curriculum = (curriculum_lib.NoPositiveResampling.from_state_dict(host.curriculum)
                  if host.curriculum is not None else curriculum_lib.NoPositiveResampling(
                      cfg.rl.npr_threshold, cfg.rl.npr_min_samples))
  admitter = sources.Admitter(prompts, g, shard.seed(cfg.run.seed), episode_for=episode_for)
  if resume:
    admitter.load_state(host.source)
  source = _make_source(cfg, sampler if cfg.pipeline.mode == "pipeline" else interruptible,
                        admitter, scorer, pool, local_p, stop, colocated=slices.colocated)
  cleanup.callback(source.close)
  evaluator = None
  if cfg.eval.every and validation:
    # Pipelined: the generator thread drives the Sampler, so eval requests go through it.
    eval_sampler = source if isinstance(source, generator.PipelineSource) else interruptible
    evaluator = eval_lib.Evaluator(eval_sampler, validation, scorer,
                                   samples_per_prompt=cfg.eval.samples_per_prompt,
                                   temperature=cfg.eval.temperature, seed=cfg.run.seed,
                                   pool=pool, shard=(shard.index, shard.count), gather=(
                                       (lambda c: distributed.allgather(c, name="eval"))
                                       if multi else None), stop=stop,
                                   episode_for=episode_for)
  if evaluator is not None and benches is not None:
    evaluator = downstream.from_config(
        cfg, evaluator, eval_sampler, tok, processes=shard.count,
        progress_for=lambda step: progress_lib.eval_progress(progress, step,
                                                             what="downstream eval"),
        episode_for=episode_for, benches=benches)
  if distributed.is_primary():
    writer = cleanup.enter_context(metrics_lib.MetricsWriter(
        run_dir, resume_step=host.metrics_rows if resume else 0,
        tensorboard=cfg.run.tensorboard))
  else:
    writer = metrics_lib.NullMetricsWriter(run_dir)
  forecaster = None
  if cfg.forecast.enabled and evaluator is not None and distributed.is_primary():
    forecaster = live.LiveForecaster.from_config(cfg.forecast, total_steps=cfg.run.steps,
                                                 seed=cfg.run.seed)
    if resume:
      _replay_forecast(forecaster, writer.path, host.metrics_rows)
  clock = clock_lib.RLClock(slices.num_devices, start_hours=host.compute_hours)
  loop = loop_lib.Loop(cfg, trainer=trainer, source=source, evaluator=evaluator, writer=writer,
                       checkpointer=ckpt, forecaster=forecaster, curriculum=curriculum,
                       shape=shape, state=host, clock=clock,
                       flops_per_token=2.0 * mcfg.num_params(active=True), progress=progress,
                       gather=gather, stop=stop)
  loop.on_step = on_step
  if on_loop is not None:  # benchmarks: time the loop's own trainer and sampler
    on_loop(loop)
  prompts.set_keep(shard.keep_hook(loop.keep_prompt))
  if not resume:
    loop.initial_eval()
    loop.save(0)
    if warm_start.has_state(warm_dir):  # checkpoint 0 now holds the warm start's result
      ckpt.wait()
      distributed.barrier("checkpoint 0 saved")
      if distributed.is_primary():
        warm_start.discard(warm_dir)
  if isinstance(source, generator.PipelineSource):
    source.start()
  return loop.run(), forecaster, loop.state


def train(cfg: Config, run_dir: str | pathlib.Path, *, resume: bool = False,
          config_path: str | None = None, stream: TextIO | None = None,
          on_step=None, on_loop=None) -> loop_lib.Outcome:
  """Runs (or resumes) the RL run described by `cfg` in `run_dir`.

  Args:
    cfg: the resolved config.
    run_dir: the run directory.
    resume: continue from the newest readable checkpoint in run_dir/checkpoints.
    config_path: shown in the header.
    stream: where progress goes (stdout by default).
    on_step: called with (step, metrics row) after each step (tests, benchmarks).
    on_loop: called with the `loop.Loop` once it is built, before the step-0 eval and
      checkpoint (benchmarks/train/rl_loop_bench.py instruments its trainer and source).

  Returns:
    The loop's Outcome (done, or stopped by a signal with a checkpoint saved, or before RL
    with the warm start's state saved).
  """
  # SIGTERM / SIGINT from here on stop the run at the next safe point with its state saved
  # (`jaxrl_scale.preempt`), whatever it is doing: warm start, eval, generation, training.
  stop = preempt.StopRequest(cfg.checkpoint.preempt_grace_seconds)
  with stop.installed():
    return _train(cfg, run_dir, resume=resume, config_path=config_path, stream=stream,
                  on_step=on_step, stop=stop, on_loop=on_loop)


def _train(cfg: Config, run_dir: str | pathlib.Path, *, resume: bool, config_path: str | None,
           stream: TextIO | None, on_step, stop: preempt.StopRequest,
           on_loop=None) -> loop_lib.Outcome:
  check_objective(cfg)
  run_dir = pathlib.Path(run_dir)
  try:
    run_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # a file of that name, no permission, ...
    raise UserError(f"run directory {run_dir}: cannot create it ({e.strerror or e})") from None
  primary = distributed.is_primary()
  progress = progress_lib.Progress(cfg.run.steps, log_every=cfg.run.log_every, stream=stream,
                                   enabled=cfg.run.progress and primary)
  if primary:
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump(config_lib.to_dict(cfg), sort_keys=False))
  mode = cfg.pipeline.mode
  mesh_cfg = dataclasses.replace(cfg.mesh, colocated=True) if mode == "colocated" else cfg.mesh
  slices = mesh_lib.make_slices(mesh_cfg)
  processes = (f" | {distributed.describe()}" if jax.process_count() > 1 else "")
  progress.print(f"jaxrl-scale train {config_path or ''} -> {run_dir}\n"
                 f"  mode {mode} | {jax.default_backend()} {slices.describe()}{processes}")

  tok = load_tokenizer(cfg)
  prompts = mixture.from_config(cfg.data, tok)
  # eval.max_prompts caps each domain's validation set (a mixture's domains come one after
  # another: a plain slice could leave the later ones out).
  validation = mixture.validation_subset(prompts.validation(), cfg.eval.max_prompts)
  loaded_s = time.perf_counter()
  load = cfg.model.path is not None and not resume  # resumed: the checkpoint has the weights
  if load:  # minutes for a large checkpoint on a network disk
    progress.print(f"  loading the policy from {cfg.model.path}")
  model, mcfg = build_policy(cfg, tok, slices.trainer, weights=not resume)
  loaded_s = time.perf_counter() - loaded_s
  p, g = cfg.rl.prompts_per_step, cfg.rl.generations_per_prompt
  seq_len = cfg.data.max_prompt_tokens + cfg.sampler.max_new_tokens
  shape = rollouts.BatchShape(num_prompts=p, group_size=g, seq_len=seq_len, pad_id=tok.pad_id)
  loaded = f" (loaded in {progress_lib.duration(loaded_s)})" if load else ""
  progress.print(f"  policy {cfg.model.path or cfg.model.preset}: {mcfg.num_params() / 1e6:.2f}M "
                 f"params{loaded} | data {prompts.origin}: {prompts.num_train} train / "
                 f"{len(validation)} validation prompts | {p} prompts x {g} samples per step")
  if cfg.forecast.enabled and cfg.optim.schedule != "constant":
    progress.print(f"  note: optim.schedule={cfg.optim.schedule} decays the learning rate; the "
                   "forecast's sigmoid assumes a constant rate (as in ScaleRL), and a decay "
                   "late in the run gains what an early fit cannot see: expect early "
                   "forecasts to be low")

  with contextlib.ExitStack() as cleanup:  # closed in reverse order, also on errors
    outcome, forecaster, host = _run(cfg, run_dir, resume, cleanup, slices, tok, prompts,
                                     validation, model, mcfg, shape, progress, on_step, stop,
                                     on_loop)
  if primary and (run_dir / "metrics.jsonl").exists():
    summary_lib.finish(cfg, run_dir, outcome, forecaster, host, progress)
  elif outcome.reason == "signal":  # stopped in the warm start, before RL
    progress.print(f"stopped by {outcome.signal_name} in the SFT warm start: run the same "
                   "command again to continue it")
  return outcome
