"""Decoder shape and dtype configuration: one frozen dataclass, named presets, HF config I/O.

`ModelConfig` describes the three supported Hugging Face families with one set of fields:

  llama  Llama 3 / 3.1: optional 'llama3' RoPE scaling, no biases.
  qwen2  Qwen2 / Qwen2.5: bias on the q/k/v projections.
  qwen3  Qwen3: RMSNorm on each q/k head, head_dim independent of hidden_size.
  qwen3_moe  Qwen3-MoE: Qwen3 attention; the MLP of its sparse layers is a mixture of
         experts (`models.moe`), the others dense (`mlp_only_layers`, `decoder_sparse_step`).

Any family may carry experts (`num_experts > 0`) for shape-only presets (the Scout-shaped
one); only qwen3_moe has a Hugging Face form.

The family fixes which of `qkv_bias` / `qk_norm` is set, so every config can be written back
as a Hugging Face config.json that `transformers` understands.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable

from jaxrl_scale.errors import UserError

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")
DTYPES = ("float32", "bfloat16")
# The full-sequence attention kernels of `models.attention` (kept here so that reading a
# config never imports JAX).
ATTENTION_IMPLS = ("auto", "einsum", "splash", "cudnn")

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
ROUTER_SCORING = ("softmax", "sigmoid")


def _check(cond: bool, key: str, message: str) -> None:
  if not cond:
    raise UserError(f"ModelConfig.{key}: {message}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1 ('llama3') RoPE frequency scaling; see `layers.rope_frequencies`."""

  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    _check(self.factor > 0, "rope_scaling.factor", f"must be > 0, got {self.factor}")
    _check(self.low_freq_factor > 0, "rope_scaling.low_freq_factor",
           f"must be > 0, got {self.low_freq_factor}")
    _check(self.high_freq_factor > self.low_freq_factor, "rope_scaling.high_freq_factor",
           f"must exceed low_freq_factor={self.low_freq_factor}, got {self.high_freq_factor}")
    _check(self.original_max_position_embeddings > 0,
           "rope_scaling.original_max_position_embeddings",
           f"must be > 0, got {self.original_max_position_embeddings}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes (D hidden, N heads, K kv heads, H head dim, F mlp, V vocab) and dtype policy."""

  family: str
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  rope_theta: float = 10_000.0
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  max_position_embeddings: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"  # activations
  # ScaleRL "FP32 logits": LM head matmul and log-softmax in float32 whatever `dtype` is.
  lm_head_fp32: bool = True
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  # Full-sequence attention (trainer, prefill): "auto" = the Pallas TPU kernel on TPU devices
  # when an activation sharding is given, cuDNN flash attention on GPUs for bf16/fp16
  # activations, else "einsum". See `models.attention`.
  attention_impl: str = "auto"
  # Mixture of experts (num_experts 0: dense). Layer i is sparse iff num_experts > 0, i is
  # not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0 (the Qwen3-MoE rule).
  num_experts: int = 0
  experts_per_token: int = 0  # top-k
  moe_intermediate_size: int = 0  # each expert's F
  # softmax: top-k of softmax(logits), renormalised to sum 1 when norm_topk_prob (Qwen3-MoE);
  # sigmoid: sigmoid of the top-k logits (Llama 4's scores; Llama 4 scales the expert's
  # input by it, we scale its output, as softmax routing does).
  router_scoring: str = "softmax"
  norm_topk_prob: bool = False
  shared_expert_size: int = 0  # F of a dense SwiGLU every sparse layer adds (Llama 4); 0: none
  mlp_only_layers: tuple[int, ...] = ()
  decoder_sparse_step: int = 1
  # Weight of the load-balancing loss (`moe.RouterStats.load_balancing_loss`) in the
  # training loss; Hugging Face's name and Qwen3-MoE's value (0.001).
  router_aux_loss_coef: float = 0.0

  def __post_init__(self):
    _check(self.family in FAMILIES, "family", f"must be one of {FAMILIES}, got {self.family!r}")
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "intermediate_size", "max_position_embeddings"):
      v = getattr(self, key)
      _check(isinstance(v, int) and not isinstance(v, bool) and v > 0, key,
             f"must be a positive int, got {v!r}")
    _check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
           f"must divide num_heads={self.num_heads}, got {self.num_kv_heads}")
    _check(self.head_dim % 2 == 0, "head_dim", f"must be even for RoPE, got {self.head_dim}")
    _check(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
    _check(self.rms_norm_eps > 0, "rms_norm_eps", f"must be > 0, got {self.rms_norm_eps}")
    for key in ("param_dtype", "dtype"):
      v = getattr(self, key)
      _check(v in DTYPES, key, f"must be one of {DTYPES}, got {v!r}")
    _check(self.attention_impl in ATTENTION_IMPLS, "attention_impl",
           f"must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
    self._check_moe()
    want_bias, want_norm = self.family == "qwen2", self.family in ("qwen3", "qwen3_moe")
    _check(self.qkv_bias == want_bias, "qkv_bias",
           f"is {want_bias} for family {self.family!r}, got {self.qkv_bias}")
    _check(self.qk_norm == want_norm, "qk_norm",
           f"is {want_norm} for family {self.family!r}, got {self.qk_norm}")
    _check(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling), "rope_scaling",
           f"must be a RopeScaling or None, got {type(self.rope_scaling).__name__}")
    if not isinstance(self.eos_token_ids, tuple):
      object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
    for key in ("bos_token_id", "pad_token_id"):
      v = getattr(self, key)
      _check(v is None or 0 <= v < self.vocab_size, key,
             f"must be in [0, vocab_size={self.vocab_size}), got {v}")
    for v in self.eos_token_ids:
      _check(0 <= v < self.vocab_size, "eos_token_ids",
             f"must be in [0, vocab_size={self.vocab_size}), got {v}")

  def _check_moe(self) -> None:
    if not isinstance(self.mlp_only_layers, tuple):
      object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
    _check(self.family != "qwen3_moe" or self.num_experts > 0, "num_experts",
           f"must be > 0 for family 'qwen3_moe', got {self.num_experts}")
    for key in ("num_experts", "experts_per_token", "moe_intermediate_size",
                "shared_expert_size"):
      v = getattr(self, key)
      _check(isinstance(v, int) and not isinstance(v, bool) and v >= 0, key,
             f"must be an int >= 0, got {v!r}")
    _check(self.router_scoring in ROUTER_SCORING, "router_scoring",
           f"must be one of {ROUTER_SCORING}, got {self.router_scoring!r}")
    _check(isinstance(self.decoder_sparse_step, int) and self.decoder_sparse_step >= 1,
           "decoder_sparse_step", f"must be an int >= 1, got {self.decoder_sparse_step!r}")
    _check(self.router_aux_loss_coef >= 0, "router_aux_loss_coef",
           f"must be >= 0, got {self.router_aux_loss_coef}")
    for i in self.mlp_only_layers:
      _check(isinstance(i, int) and 0 <= i < self.num_layers, "mlp_only_layers",
             f"must hold layer indices in [0, num_layers={self.num_layers}), got {i!r}")
    if self.num_experts:
      _check(1 <= self.experts_per_token <= self.num_experts, "experts_per_token",
             f"must be in [1, num_experts={self.num_experts}], got {self.experts_per_token}")
      _check(self.moe_intermediate_size > 0, "moe_intermediate_size",
             f"must be > 0 with num_experts={self.num_experts}, got 0")

  def moe_layers(self) -> tuple[bool, ...]:
    """Per layer: whether its MLP is the mixture of experts (the Qwen3-MoE rule)."""
    return tuple(self.num_experts > 0 and i not in self.mlp_only_layers
                 and (i + 1) % self.decoder_sparse_step == 0 for i in range(self.num_layers))

  def num_params(self, active: bool = False) -> int:
    """Parameter count (embedding counted once when tied); `active`: only the experts a
    token uses (top-k of them), the count that sets FLOPs per token."""
    d, n, k, h, f = (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                     self.intermediate_size)
    attn = d * n * h * 2 + d * k * h * 2
    if self.qkv_bias:
      attn += (n + 2 * k) * h
    if self.qk_norm:
      attn += 2 * h
    experts = self.experts_per_token if active else self.num_experts
    sparse = (d * self.num_experts + 3 * d * self.moe_intermediate_size * experts
              + 3 * d * self.shared_expert_size)
    mlps = sum(sparse if moe else 3 * d * f for moe in self.moe_layers())
    embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
    return self.num_layers * (attn + 2 * d) + mlps + embed + d


# ----------------------------------------------------------------------------------------
# Presets. Real shapes come from the published config.json of each checkpoint.

_QWEN_SPECIAL = dict(bos_token_id=151643, eos_token_ids=(151645,), pad_token_id=151643)
_LLAMA31_SPECIAL = dict(bos_token_id=128000, eos_token_ids=(128001, 128008, 128009))
# Tiny presets match the built-in byte tokenizer (models/tokenizer.py: 264 ids, pad 256,
# bos 257, eos 258).
_TINY = dict(vocab_size=264, bos_token_id=257, eos_token_ids=(258,), pad_token_id=256)


def qwen3_0p6b() -> ModelConfig:
  return ModelConfig(family="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28,
                     num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=3072,
                     rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
                     max_position_embeddings=40960, **_QWEN_SPECIAL)


def qwen3_1p7b() -> ModelConfig:
  return ModelConfig(family="qwen3", vocab_size=151936, hidden_size=2048, num_layers=28,
                     num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=6144,
                     rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
                     max_position_embeddings=40960, **_QWEN_SPECIAL)


def qwen3_8b() -> ModelConfig:
  return ModelConfig(family="qwen3", vocab_size=151936, hidden_size=4096, num_layers=36,
                     num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=12288,
                     rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
                     max_position_embeddings=40960, **_QWEN_SPECIAL)


def qwen2p5_1p5b() -> ModelConfig:
  return ModelConfig(family="qwen2", vocab_size=151936, hidden_size=1536, num_layers=28,
                     num_heads=12, num_kv_heads=2, head_dim=128, intermediate_size=8960,
                     rope_theta=1_000_000.0, qkv_bias=True, tie_embeddings=True,
                     max_position_embeddings=32768, **_QWEN_SPECIAL)


def qwen2p5_7b() -> ModelConfig:
  return ModelConfig(family="qwen2", vocab_size=152064, hidden_size=3584, num_layers=28,
                     num_heads=28, num_kv_heads=4, head_dim=128, intermediate_size=18944,
                     rope_theta=1_000_000.0, qkv_bias=True, tie_embeddings=False,
                     max_position_embeddings=32768, **_QWEN_SPECIAL)


def llama3p1_8b() -> ModelConfig:
  return ModelConfig(family="llama", vocab_size=128256, hidden_size=4096, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
                     rope_theta=500_000.0, rope_scaling=RopeScaling(), rms_norm_eps=1e-5,
                     max_position_embeddings=131072, **_LLAMA31_SPECIAL)


def tiny_llama() -> ModelConfig:
  return ModelConfig(family="llama", **_TINY, hidden_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                     rope_theta=10_000.0, rms_norm_eps=1e-5, max_position_embeddings=2048,
                     rope_scaling=RopeScaling(factor=4.0, original_max_position_embeddings=256))


def tiny_qwen2() -> ModelConfig:
  return ModelConfig(family="qwen2", **_TINY, hidden_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                     qkv_bias=True, tie_embeddings=True, max_position_embeddings=2048)


def tiny_qwen3() -> ModelConfig:
  # head_dim 32 != hidden 64 / heads 4, as in real Qwen3 models.
  return ModelConfig(family="qwen3", **_TINY, hidden_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=128,
                     qk_norm=True, tie_embeddings=True, max_position_embeddings=2048)


def qwen3_30b_a3b() -> ModelConfig:
  """Qwen3-30B-A3B: 48 layers, all sparse, 128 experts of which 8 per token (3.3B active)."""
  return ModelConfig(family="qwen3_moe", vocab_size=151936, hidden_size=2048, num_layers=48,
                     num_heads=32, num_kv_heads=4, head_dim=128, intermediate_size=6144,
                     rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
                     max_position_embeddings=40960, num_experts=128, experts_per_token=8,
                     moe_intermediate_size=768, norm_topk_prob=True,
                     router_aux_loss_coef=0.001, **_QWEN_SPECIAL)


def llama4_scout_shaped() -> ModelConfig:
  """Llama 4 Scout's shapes (109B total, 17B active): 48 sparse layers of 16 experts, top-1
  with sigmoid scores, plus a shared expert. Shapes only: Llama 4's chunked and NoPE
  attention layers and its L2 qk norm are not modelled (Llama 3 attention instead), so it
  has no Hugging Face form."""
  return ModelConfig(family="llama", vocab_size=202048, hidden_size=5120, num_layers=48,
                     num_heads=40, num_kv_heads=8, head_dim=128, intermediate_size=16384,
                     rope_theta=500_000.0, rms_norm_eps=1e-5, max_position_embeddings=131072,
                     num_experts=16, experts_per_token=1, moe_intermediate_size=8192,
                     router_scoring="sigmoid", shared_expert_size=8192,
                     bos_token_id=200000, eos_token_ids=(200001, 200007, 200008),
                     pad_token_id=200018)


def tiny_qwen3_moe() -> ModelConfig:
  """Three layers, the middle one dense, 8 experts of which 2 per token."""
  return ModelConfig(family="qwen3_moe", **_TINY, hidden_size=64, num_layers=3,
                     num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=128,
                     qk_norm=True, tie_embeddings=True, max_position_embeddings=2048,
                     num_experts=8, experts_per_token=2, moe_intermediate_size=32,
                     norm_topk_prob=True, mlp_only_layers=(1,), router_aux_loss_coef=0.001)


def small() -> ModelConfig:
  """About 50M parameters: the largest model the CPU demo is meant to train."""
  return ModelConfig(family="llama", **_TINY, hidden_size=640, num_layers=11,
                     num_heads=10, num_kv_heads=5, head_dim=64, intermediate_size=1728,
                     rope_theta=10_000.0, rms_norm_eps=1e-5, max_position_embeddings=4096)


def small_qwen3() -> ModelConfig:
  """About 55M parameters in Qwen3's proportions (q/k norm, head_dim 128 with heads x
  head_dim = 2 x hidden, MLP 3 x hidden, tied embeddings) for the byte tokenizer:
  configs/gpu_small.yaml's policy."""
  return ModelConfig(family="qwen3", **_TINY, hidden_size=512, num_layers=14,
                     num_heads=8, num_kv_heads=4, head_dim=128, intermediate_size=1536,
                     qk_norm=True, tie_embeddings=True, max_position_embeddings=2048)


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "qwen3_0p6b": qwen3_0p6b,
    "qwen3_1p7b": qwen3_1p7b,
    "qwen3_8b": qwen3_8b,
    "qwen2p5_1p5b": qwen2p5_1p5b,
    "qwen2p5_7b": qwen2p5_7b,
    "llama3p1_8b": llama3p1_8b,
    "qwen3_30b_a3b": qwen3_30b_a3b,
    "llama4_scout_shaped": llama4_scout_shaped,
    "tiny_llama": tiny_llama,
    "tiny_qwen2": tiny_qwen2,
    "tiny_qwen3": tiny_qwen3,
    "tiny_qwen3_moe": tiny_qwen3_moe,
    "small": small,
    "small_qwen3": small_qwen3,
}


def preset(name: str) -> ModelConfig:
  """Returns the named preset; unknown names raise UserError listing the valid ones."""
  if name not in PRESETS:
    near = difflib.get_close_matches(name, PRESETS, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UserError(f"model preset {name!r} is unknown; {hint}valid: {', '.join(sorted(PRESETS))}")
  return PRESETS[name]()


# ----------------------------------------------------------------------------------------
# Hugging Face config.json <-> ModelConfig.

# float16 checkpoints load as float32: lossless, whereas bfloat16 would drop mantissa bits.
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}


def _hf_get(hf: dict[str, Any], key: str, source: str, default: Any = dataclasses.MISSING) -> Any:
  if key in hf and hf[key] is not None:
    return hf[key]
  if default is dataclasses.MISSING:
    raise UserError(f"{source}: missing key '{key}'")
  return default


def _hf_rope(hf: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
  # transformers >= 5 writes `rope_parameters` (theta inside); older files `rope_theta` +
  # `rope_scaling`. Real checkpoints on the Hub use the old form.
  params = hf.get("rope_parameters") or {}
  theta = float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
  scaling = hf.get("rope_scaling") or params
  rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
  if rope_type == "default":
    return theta, None
  if rope_type != "llama3":
    raise UserError(f"{source}: key 'rope_scaling.rope_type' = {rope_type!r} is unsupported "
                    "(supported: 'default', 'llama3')")
  try:
    return theta, RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]))
  except KeyError as e:
    raise UserError(f"{source}: missing key 'rope_scaling.{e.args[0]}'") from None


def from_hf_config(hf: dict[str, Any], source: str = "config.json", **overrides: Any
                   ) -> ModelConfig:
  """Builds a ModelConfig from a parsed Hugging Face config.json.

  Args:
    hf: the parsed config.json.
    source: what to name in error messages (usually the file path).
    **overrides: ModelConfig fields to set instead of the derived values (e.g. dtype).

  Returns:
    The config. Unsupported architectures or options raise UserError naming the key.
  """
  family = hf.get("model_type")
  if family not in FAMILIES:
    raise UserError(f"{source}: key 'model_type' = {family!r} is unsupported "
                    f"(supported: {', '.join(FAMILIES)})")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise UserError(f"{source}: key 'hidden_act' = {act!r} is unsupported (only 'silu')")
  for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
    if hf.get(key):
      raise UserError(f"{source}: key '{key}' = true is unsupported")
  hidden = int(_hf_get(hf, "hidden_size", source))
  heads = int(_hf_get(hf, "num_attention_heads", source))
  theta, scaling = _hf_rope(hf, source)
  eos = hf.get("eos_token_id")
  eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
  torch_dtype = hf.get("torch_dtype", hf.get("dtype")) or "float32"
  if torch_dtype not in _HF_DTYPES:
    raise UserError(f"{source}: key 'torch_dtype' = {torch_dtype!r} is unsupported "
                    f"(supported: {', '.join(_HF_DTYPES)})")
  fields = dict(
      family=family,
      vocab_size=int(_hf_get(hf, "vocab_size", source)),
      hidden_size=hidden,
      num_layers=int(_hf_get(hf, "num_hidden_layers", source)),
      num_heads=heads,
      num_kv_heads=int(_hf_get(hf, "num_key_value_heads", source, heads)),
      head_dim=int(_hf_get(hf, "head_dim", source, hidden // heads)),
      intermediate_size=int(_hf_get(hf, "intermediate_size", source)),
      rope_theta=theta,
      rope_scaling=scaling,
      rms_norm_eps=float(_hf_get(hf, "rms_norm_eps", source, 1e-6)),
      qkv_bias=family == "qwen2",
      qk_norm=family in ("qwen3", "qwen3_moe"),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=int(_hf_get(hf, "max_position_embeddings", source, 4096)),
      param_dtype=_HF_DTYPES[torch_dtype],
      dtype=_HF_DTYPES[torch_dtype],
      bos_token_id=hf.get("bos_token_id"),
      eos_token_ids=eos_ids,
      pad_token_id=hf.get("pad_token_id"),
  )
  if family == "qwen3_moe":
    fields.update(_hf_moe(hf, source))
  fields.update(overrides)
  return ModelConfig(**fields)


def _hf_moe(hf: dict[str, Any], source: str) -> dict[str, Any]:
  """The MoE fields of a Qwen3-MoE config.json (transformers 5 writes `num_local_experts`)."""
  experts = hf.get("num_experts", hf.get("num_local_experts"))
  if experts is None:
    raise UserError(f"{source}: missing key 'num_experts'")
  return dict(
      num_experts=int(experts),
      experts_per_token=int(_hf_get(hf, "num_experts_per_tok", source)),
      moe_intermediate_size=int(_hf_get(hf, "moe_intermediate_size", source)),
      norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
      mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
      decoder_sparse_step=int(_hf_get(hf, "decoder_sparse_step", source, 1)),
      router_aux_loss_coef=float(_hf_get(hf, "router_aux_loss_coef", source, 0.001)))


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The Hugging Face config.json for `cfg` (old-style rope keys, read by every version).

  A config with experts outside family qwen3_moe (or a shared expert, or sigmoid scores)
  has no Hugging Face form: UserError.
  """
  if cfg.num_experts and (cfg.family != "qwen3_moe" or cfg.shared_expert_size
                          or cfg.router_scoring != "softmax"):
    raise UserError(f"ModelConfig: a {cfg.family!r} model with {cfg.num_experts} experts "
                    f"(shared_expert_size={cfg.shared_expert_size}, router_scoring="
                    f"{cfg.router_scoring!r}) has no Hugging Face form; only qwen3_moe "
                    "(softmax scores, no shared expert) is written")
  hf: dict[str, Any] = {
      "architectures": [_ARCHITECTURES[cfg.family]],
      "model_type": cfg.family,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": cfg.max_position_embeddings,
      "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_scaling": None,
      "tie_word_embeddings": cfg.tie_embeddings,
      "torch_dtype": cfg.param_dtype,
      "attention_dropout": 0.0,
      "use_cache": True,
      "bos_token_id": cfg.bos_token_id,
      "eos_token_id": (cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1
                       else list(cfg.eos_token_ids) or None),
      "pad_token_id": cfg.pad_token_id,
  }
  if cfg.rope_scaling is not None:
    hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
  if cfg.family == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  else:
    hf.update(use_sliding_window=False, sliding_window=None)
    if cfg.family in ("qwen3", "qwen3_moe"):
      hf["attention_bias"] = False
  if cfg.family == "qwen3_moe":
    hf.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
              moe_intermediate_size=cfg.moe_intermediate_size,
              norm_topk_prob=cfg.norm_topk_prob, mlp_only_layers=list(cfg.mlp_only_layers),
              decoder_sparse_step=cfg.decoder_sparse_step,
              router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False)
  return hf
