"""Typed run configuration: nested frozen dataclasses, YAML overrides, dotted CLI overrides.

One source of truth: the dataclasses hold every default. A YAML file only overrides them,
and `key.sub=value` arguments override the file. Every section validates itself in
`__post_init__`; an unknown key, a wrong type or an invalid value becomes a one-line
`UserError` naming the dotted key (with the nearest valid name for typos); the loading
itself is `config_io`'s.

This module holds the run-level sections (`run`, `checkpoint`, `forecast`), the `Config`
that assembles every section and checks the rules between them, and the loading functions.
The other sections live by subject in `config_model` (model, mesh), `config_data` (data),
`config_generation` (sampler, env, eval) and `config_training` (rl, optim, sft, pipeline);
every section class is importable from here.

    cfg = config.load("configs/cpu_tiny.yaml", ["rl.loss=grpo", "optim.lr=1e-6"])
"""

from __future__ import annotations

import dataclasses
import pathlib

from jaxrl_scale import config_io
from jaxrl_scale.config_data import DataConfig, SourceConfig
from jaxrl_scale.config_generation import EnvConfig, EvalConfig, SamplerConfig
from jaxrl_scale.config_model import MeshConfig, ModelSpec
from jaxrl_scale.config_training import OptimConfig, PipelineConfig, RLConfig, SFTConfig

__all__ = [
    "CheckpointConfig", "Config", "DataConfig", "EnvConfig", "EvalConfig", "ForecastConfig",
    "MeshConfig", "ModelSpec", "OptimConfig", "PipelineConfig", "RLConfig", "RunConfig",
    "SFTConfig", "SamplerConfig", "SourceConfig", "from_dict", "load", "parse_overrides",
    "read_yaml", "replace", "to_dict",
]

_check = config_io.check


# ----------------------------------------------------------------------------------------
# Run-level sections.


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Where a run writes and how long it runs."""

  name: str = "run"  # the run's label, kept in its resolved config.yaml
  output_dir: str = "runs/run"  # run directory (train's --output-dir overrides it)
  seed: int = 0  # model init, sampling and rollout seeds
  steps: int = 100  # RL optimizer steps
  log_every: int = 1  # steps between progress lines (eval steps always print)
  tensorboard: bool = True  # TensorBoard event files beside metrics.jsonl
  progress: bool = True  # print progress lines to stdout
  # End the SFT warm start (sft.steps at most) once the policy's sampled pass rate on
  # `sft_dev_prompts` training prompts held out of SFT reaches this, checked every
  # `sft_check_every` steps (every `sft_check_every_near` once half the target is reached): RL then starts
  # from a known level of skill rather than wherever a fixed step count lands (small models
  # learn in sudden jumps). None = all sft.steps.
  sft_stop_pass_rate: float | None = None
  sft_dev_prompts: int = 64  # training prompts held out of SFT to measure that pass rate
  sft_check_every: int = 5  # SFT steps between those measurements
  # ... once a check has passed half the target: 1 stops within a step of it; a run whose
  # checks cost many SFT steps (an environment's tool calls) and whose rate climbs slowly
  # saves most of them with a few steps.
  sft_check_every_near: int = 1

  def __post_init__(self):
    _check(self.steps >= 0, "run.steps", f"must be >= 0, got {self.steps}")
    _check(self.log_every >= 1, "run.log_every", f"must be >= 1, got {self.log_every}")
    _check(self.sft_stop_pass_rate is None or 0 < self.sft_stop_pass_rate <= 1,
           "run.sft_stop_pass_rate", f"must be in (0, 1] or null, got {self.sft_stop_pass_rate}")
    _check(self.sft_dev_prompts >= 1, "run.sft_dev_prompts", "must be >= 1")
    _check(self.sft_check_every >= 1, "run.sft_check_every", "must be >= 1")
    _check(self.sft_check_every_near >= 1, "run.sft_check_every_near", "must be >= 1")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Orbax checkpoints of the whole run state in the run directory, and preemption."""

  every: int = 50  # steps between checkpoints (0 = only at the end and on signals)
  keep: int = 3  # newest checkpoints kept; older ones are deleted
  async_save: bool = True  # write checkpoints in the background while training goes on
  # After SIGTERM/SIGINT the run saves and exits; past this many seconds a watchdog ends it
  # (exit 1, earlier checkpoints intact). 30 s is a preemptible VM's notice; 0 = no deadline.
  preempt_grace_seconds: float = 30.0

  def __post_init__(self):
    _check(self.every >= 0, "checkpoint.every", "must be >= 0")
    _check(self.keep >= 1, "checkpoint.keep", "must be >= 1")
    _check(self.preempt_grace_seconds >= 0, "checkpoint.preempt_grace_seconds", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class ForecastConfig:
  """Live sigmoid forecast of the validation pass rate (scaling/)."""

  enabled: bool = True  # refit the sigmoid after every eval (forecast/* metrics)
  axis: str = "flops"  # compute axis: flops (model FLOPs, steady under load) or hours
  target_compute_hours: float | None = None  # default: the run's projected total
  min_compute_hours: float = 0.0  # points below this are excluded from the fit
  n_boot: int = 200  # bootstrap refits per eval for the intervals (0 = none)
  plot: bool = True  # write forecast.png at the end of the run

  def __post_init__(self):
    _check(self.axis in ("flops", "hours"), "forecast.axis",
           f"must be 'flops' or 'hours', got {self.axis!r}")
    _check(self.n_boot >= 0, "forecast.n_boot", "must be >= 0")


# ----------------------------------------------------------------------------------------
# The whole run's config.


@dataclasses.dataclass(frozen=True)
class Config:
  run: RunConfig = RunConfig()
  model: ModelSpec = ModelSpec()
  mesh: MeshConfig = MeshConfig()
  data: DataConfig = DataConfig()
  sampler: SamplerConfig = SamplerConfig()
  rl: RLConfig = RLConfig()
  optim: OptimConfig = OptimConfig()
  sft: SFTConfig = SFTConfig()
  pipeline: PipelineConfig = PipelineConfig()
  env: EnvConfig = EnvConfig()
  eval: EvalConfig = EvalConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  forecast: ForecastConfig = ForecastConfig()

  def __post_init__(self):
    # A Config describes an RL run (`jaxrl-scale generate` takes a SamplerConfig alone).
    # The trainer's log-probs are log-softmax(logits / temperature) over the whole
    # vocabulary; with top-k / top-p the sampler draws from a truncated, renormalised
    # distribution, so the importance ratio pi_train / pi_gen would compare two different
    # distributions.
    _check(self.sampler.top_p == 1.0, "sampler.top_p",
           f"must be 1 in an RL run, got {self.sampler.top_p} (the trainer's log-probs "
           "cover the whole vocabulary; a truncated sampler makes the importance ratio wrong)")
    _check(self.sampler.top_k == 0, "sampler.top_k",
           f"must be 0 in an RL run, got {self.sampler.top_k} (the trainer's log-probs "
           "cover the whole vocabulary; a truncated sampler makes the importance ratio wrong)")
    seq_len = self.data.max_prompt_tokens + self.sampler.max_new_tokens
    _check(not self.optim.sequence_parallel or seq_len % self.mesh.trainer_tp == 0,
           "optim.sequence_parallel",
           f"the sequence length {seq_len} (data.max_prompt_tokens + sampler.max_new_tokens) "
           f"does not split over mesh.trainer_tp={self.mesh.trainer_tp}")
    _check(self.env.max_tokens <= self.sampler.max_new_tokens, "env.max_tokens",
           f"must be at most sampler.max_new_tokens={self.sampler.max_new_tokens} (the "
           f"sampler ends every sequence there), got {self.env.max_tokens}")
    _check(not self.env.name or self.model.routing == "own", "env.name",
           "multi-turn episodes do not record routing yet: use model.routing=own")


# ----------------------------------------------------------------------------------------
# Loading (`config_io` builds any of these dataclasses from dicts, YAML and overrides).

to_dict = config_io.to_dict
parse_overrides = config_io.parse_overrides
read_yaml = config_io.read_yaml
_coerce = config_io._coerce  # pylint: disable=protected-access


def from_dict(data: dict, cls=Config):
  """Builds `cls` from a nested dict of overrides on top of the defaults."""
  return config_io.from_dict(data, cls)


def load(path: str | pathlib.Path | None = None, overrides: list[str] = (), cls=Config):
  """Defaults, then the YAML file at `path` (if any), then dotted `overrides`."""
  return config_io.load(path, overrides, cls)


def replace(cfg, **changes):
  """dataclasses.replace for dotted keys: replace(cfg, **{'rl.loss': 'grpo'})."""
  return config_io.replace(cfg, **changes)
