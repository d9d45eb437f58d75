"""Config sections of the policy and its devices: `model` (which policy, its dtypes and
kernels) and `mesh` (how the devices split into trainer and generator slices).

Part of `jaxrl_scale.config`, which assembles the sections into one `Config`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxrl_scale import config_io

_check = config_io.check


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Which policy to train: a named preset (random init) or a Hugging Face directory."""

  preset: str = "tiny_llama"  # models/config.py preset, e.g. tiny_llama, qwen3_0p6b, llama3p1_8b
  path: str | None = None  # Hugging Face directory; overrides preset when set
  tokenizer: str = "byte"  # "byte" (built-in) or a directory holding tokenizer.json
  dtype: Literal["float32", "bfloat16"] = "float32"  # activations (the forward's compute)
  # Weights as loaded and as the generator holds them. The trainer always keeps float32
  # master weights and AdamW moments (a bf16 weight does not move at lr 5e-7) and sends the
  # generator a copy cast to this dtype; checkpoints hold the float32 masters.
  param_dtype: Literal["float32", "bfloat16"] = "float32"
  # ScaleRL "FP32 logits": LM head matmul and log-softmax in float32 in BOTH sampler and
  # trainer, whatever the activation dtype (paper sec. 3.2: A 0.52 -> 0.61).
  lm_head_fp32: bool = True
  # Full-sequence attention (train step, prefill): "auto" = the Pallas splash kernel on TPU,
  # cuDNN's fused flash attention on NVIDIA GPUs (bfloat16/float16 activations), the einsum
  # elsewhere; "einsum" forces the XLA reference everywhere (e.g. if cuDNN fails on a GPU).
  attention_impl: Literal["auto", "einsum", "cudnn", "splash"] = "auto"
  # Shape overrides of a preset (random init only), e.g. to size the CPU demo's model.
  hidden_size: int | None = None
  num_layers: int | None = None  # decoder layers of the preset; null = the preset's
  intermediate_size: int | None = None  # MLP width of the preset; null = the preset's
  init_std: float = 0.02  # std of the random init of matrices (presets without a path)
  # MoE policies: "own" = the trainer routes every token itself; "record" = the sampler
  # also records its expert choices (layers x top-k per position) and the trainer logs
  # train/routing_mismatch against them; "replay" = the trainer's forward uses the recorded
  # choices (gates still from its own router) and logs how often its own would differ.
  # No effect, and no cost, on a dense model.
  routing: Literal["own", "record", "replay"] = "own"

  def __post_init__(self):
    for key in ("hidden_size", "num_layers", "intermediate_size"):
      v = getattr(self, key)
      _check(v is None or v >= 1, f"model.{key}", f"must be >= 1 or null, got {v}")
    _check(self.init_std > 0, "model.init_std", f"must be > 0, got {self.init_std}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """How the device set splits into a trainer slice and a generator slice.

  `trainer_devices` / `generator_devices` are counts (int >= 1) or fractions of all devices
  (0 < x < 1). With `colocated` both roles share all devices and alternate.
  """

  colocated: bool = False  # both roles on all devices, taking turns
  trainer_devices: float = 0.5  # devices of the trainer slice: a count or a fraction
  generator_devices: float = 0.5  # devices of the generator slice: a count or a fraction
  trainer_tp: int = 1  # trainer mesh is ('fsdp', 'tp'); fsdp takes the remaining devices
  generator_tp: int = 1  # generator mesh is ('data', 'tp'); data takes the remaining devices
  # Expert parallelism: >1 adds an 'expert' axis to the trainer mesh, ('fsdp', 'expert',
  # 'tp'), taken out of fsdp; each device holds E / trainer_ep of an MoE layer's experts and
  # the tokens go to them. Outside the MoE layers it splits the batch like fsdp.
  trainer_ep: int = 1
  # As trainer_ep, for each generator group: ('data', 'expert', 'tp'), taken out of data.
  generator_ep: int = 1
  simulated_cpu_devices: int = 8  # CPU only: devices to simulate when no accelerator exists

  def __post_init__(self):
    for key in ("trainer_devices", "generator_devices"):
      v = getattr(self, key)
      _check(v > 0, f"mesh.{key}", f"must be a count >= 1 or a fraction in (0, 1), got {v}")
      _check(v < 1 or float(v).is_integer(), f"mesh.{key}", f"a count must be whole, got {v}")
    for key in ("trainer_tp", "generator_tp", "trainer_ep", "generator_ep",
                "simulated_cpu_devices"):
      v = getattr(self, key)
      _check(v >= 1, f"mesh.{key}", f"must be >= 1, got {v}")
