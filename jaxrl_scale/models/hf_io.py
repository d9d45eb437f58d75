"""Hugging Face checkpoint directories in and out (config.json + safetensors + tokenizer files).

Loading never builds a full unsharded copy: each parameter is created with
`jax.make_array_from_callback`, whose callback reads from the memory-mapped safetensors file
only the slice a device owns (a superset only along a merged heads*head_dim axis).

Layout mapping (HF `nn.Linear.weight` is [out, in]; ours put the input dim first):
  q_proj.weight [N*H, D] -> kernel [D, N, H]      o_proj.weight [D, N*H] -> kernel [N, H, D]
  q_proj.bias   [N*H]    -> bias   [N, H]         gate/up_proj  [F, D]   -> kernel [D, F]
  down_proj     [D, F]   -> kernel [F, D]         lm_head       [V, D]   -> kernel [D, V]
  embed_tokens, norms: unchanged.
Layer i of `model.layers.{i}.*` is index i of our stacked `layers.*` params ([L, ...]).
Qwen3-MoE sparse layers: mlp.gate.weight [E, D] -> layers.moe.router [L, D, E]; expert j's
  mlp.experts.{j}.{gate,up}_proj.weight [F, D] -> layers.moe.{gate,up}_proj [L, E, D, F] at
  [i, j], down_proj [D, F] -> layers.moe.down_proj [L, E, F, D]. In a model that mixes
  dense and sparse layers, the slots a layer does not use load as zeros and are not saved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors needs)
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config as config_lib
from jaxrl_scale.models import sharding, transformer
from jaxrl_scale.models.config import ModelConfig

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
    "chat_template.json", "generation_config.json",
)
_INDEX = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One HF tensor: ours[layer] (or ours) = hf.reshape(concat(groups)).transpose(perm)."""

  path: tuple[Any, ...]  # our nnx state path
  hf_key: str
  groups: tuple[tuple[int, ...], ...]  # how each HF dim splits into our dims
  perm: tuple[int, ...]
  layer: int | None = None  # index on the leading layer axis of a stacked param
  expert: int | None = None  # index on the expert axis after it (an expert's own tensor)

  @property
  def lead(self) -> tuple[int, ...]:
    """This tensor's index on the stacked param's leading (layer, expert) axes."""
    return tuple(i for i in (self.layer, self.expert) if i is not None)

  @property
  def hf_shape(self) -> tuple[int, ...]:
    return tuple(math.prod(g) for g in self.groups)

  @property
  def shape(self) -> tuple[int, ...]:
    """Our shape of this one tensor (one layer's slice of a stacked param)."""
    split = [s for g in self.groups for s in g]
    return tuple(split[p] for p in self.perm)


def layout(cfg: ModelConfig) -> list[_Entry]:
  """Every Hugging Face tensor of a `cfg` model, in Hugging Face order."""
  d, n, k, h, f, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.intermediate_size, cfg.vocab_size)
  sparse = cfg.moe_layers()
  out = [_Entry(("embed_tokens", "embedding"), "model.embed_tokens.weight", ((v,), (d,)), (0, 1))]
  for i in range(cfg.num_layers):
    pre, our = f"model.layers.{i}.", ("layers",)
    att = our + ("self_attn",)
    kw = dict(layer=i)
    out.append(_Entry(our + ("input_layernorm", "scale"), pre + "input_layernorm.weight",
                      ((d,),), (0,), **kw))
    for name, heads in (("q_proj", n), ("k_proj", k), ("v_proj", k)):
      out.append(_Entry(att + (name, "kernel"), f"{pre}self_attn.{name}.weight",
                        ((heads, h), (d,)), (2, 0, 1), **kw))
      if cfg.qkv_bias:
        out.append(_Entry(att + (name, "bias"), f"{pre}self_attn.{name}.bias",
                          ((heads, h),), (0, 1), **kw))
    out.append(_Entry(att + ("o_proj", "kernel"), pre + "self_attn.o_proj.weight",
                      ((d,), (n, h)), (1, 2, 0), **kw))
    if cfg.qk_norm:
      for name in ("q_norm", "k_norm"):
        out.append(_Entry(att + (name, "scale"), f"{pre}self_attn.{name}.weight", ((h,),), (0,),
                          **kw))
    out.append(_Entry(our + ("post_attention_layernorm", "scale"),
                      pre + "post_attention_layernorm.weight", ((d,),), (0,), **kw))
    if sparse[i]:
      out += _expert_entries(cfg, i)
      continue
    for name in ("gate_proj", "up_proj"):
      out.append(_Entry(our + ("mlp", name, "kernel"), f"{pre}mlp.{name}.weight",
                        ((f,), (d,)), (1, 0), **kw))
    out.append(_Entry(our + ("mlp", "down_proj", "kernel"), pre + "mlp.down_proj.weight",
                      ((d,), (f,)), (1, 0), **kw))
  out.append(_Entry(("norm", "scale"), "model.norm.weight", ((d,),), (0,)))
  if not cfg.tie_embeddings:
    out.append(_Entry(("lm_head", "kernel"), "lm_head.weight", ((v,), (d,)), (1, 0)))
  return out


def _expert_entries(cfg: ModelConfig, i: int) -> list[_Entry]:
  """Layer i's router and experts, in Hugging Face (Qwen3-MoE) order."""
  if cfg.family != "qwen3_moe" or cfg.shared_expert_size or cfg.router_scoring != "softmax":
    raise UserError(f"a {cfg.family!r} model with experts (shared_expert_size="
                    f"{cfg.shared_expert_size}, router_scoring={cfg.router_scoring!r}) has no "
                    "Hugging Face form; only qwen3_moe does")
  d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
  pre, our = f"model.layers.{i}.mlp.", ("layers", "moe")
  out = [_Entry(our + ("router",), pre + "gate.weight", ((e,), (d,)), (1, 0), layer=i)]
  for j in range(e):
    for name in ("gate_proj", "up_proj"):
      out.append(_Entry(our + (name,), f"{pre}experts.{j}.{name}.weight", ((f,), (d,)), (1, 0),
                        layer=i, expert=j))
    out.append(_Entry(our + ("down_proj",), f"{pre}experts.{j}.down_proj.weight",
                      ((d,), (f,)), (1, 0), layer=i, expert=j))
  return out


# ----------------------------------------------------------------------------------------
# Loading.


def read_hf_config(path: str) -> dict[str, Any]:
  """The parsed config.json of a checkpoint directory."""
  cfg_path = os.path.join(path, "config.json")
  try:
    with open(cfg_path) as fh:
      hf = json.load(fh)
  except FileNotFoundError:
    raise UserError(f"{cfg_path}: not found (is {path!r} a Hugging Face model directory?)"
                    ) from None
  except (OSError, json.JSONDecodeError) as e:
    raise UserError(f"{cfg_path}: unreadable ({e})") from None
  if not isinstance(hf, dict):
    raise UserError(f"{cfg_path}: must hold a JSON object")
  return hf


def read_model_config(path: str, **overrides: Any) -> ModelConfig:
  """The ModelConfig of a checkpoint directory's config.json (`overrides`: fields to set)."""
  return config_lib.from_hf_config(read_hf_config(path), os.path.join(path, "config.json"),
                                   **overrides)


def _weight_map(path: str) -> dict[str, str]:
  """hf_key -> safetensors file path, from the index or from the file(s) themselves."""
  index_path = os.path.join(path, _INDEX)
  if os.path.exists(index_path):
    try:
      with open(index_path) as fh:
        wmap = json.load(fh)["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
      raise UserError(f"{index_path}: unreadable index ({e!r})") from None
    return {key: os.path.join(path, name) for key, name in wmap.items()}
  files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise UserError(f"{path}: no *.safetensors files and no {_INDEX}")
  wmap = {}
  for name in files:
    file_path = os.path.join(path, name)
    with _open(file_path) as handle:
      wmap.update({key: file_path for key in handle.keys()})
  return wmap


@contextlib.contextmanager
def _open(file_path: str) -> Iterator[Any]:
  try:
    handle_cm = safe_open(file_path, framework="np")
    handle = handle_cm.__enter__()
  except Exception as e:  # safetensors raises several types for bad files
    raise UserError(f"{file_path}: cannot read safetensors ({e})") from None
  try:
    yield handle
  finally:
    handle_cm.__exit__(None, None, None)


def _read_slice(handle: Any, entry: _Entry, index: tuple[slice, ...] | None,
                dtype: np.dtype) -> np.ndarray:
  """The part `index` of our (transposed) tensor, reading only the rows it needs."""
  index = index if index is not None else (slice(None),) * len(entry.shape)
  split_shape = [s for g in entry.groups for s in g]
  split_ranges: list[tuple[int, int]] = [(0, 0)] * len(split_shape)
  for j, sl in enumerate(index):
    start, stop, _ = sl.indices(entry.shape[j])
    split_ranges[entry.perm[j]] = (start, stop)
  hf_slices, read_shape, post = [], [], []
  pos = 0
  for group in entry.groups:
    inner = math.prod(group[1:])
    start, stop = split_ranges[pos]
    hf_slices.append(slice(start * inner, stop * inner))
    read_shape += [stop - start, *group[1:]]
    post += [slice(None)] + [slice(*split_ranges[pos + i]) for i in range(1, len(group))]
    pos += len(group)
  raw = handle.get_slice(entry.hf_key)[tuple(hf_slices)]
  arr = np.asarray(raw).reshape(read_shape)[tuple(post)]
  return np.ascontiguousarray(arr.transpose(entry.perm)).astype(dtype)


def _read_param(parts: dict[tuple[int, ...], tuple[Any, _Entry]], shape: tuple[int, ...],
                index: tuple[slice, ...] | None, dtype: np.dtype) -> np.ndarray:
  """The part `index` of a param of `shape`: one tensor, or the tensors its leading
  (layer[, expert]) axes stack, the ones `index` selects; a slot no tensor fills (the
  unused MLP of an interleaved model's layer) reads as zeros."""
  _, entry = next(iter(parts.values()))
  lead = len(entry.lead)
  if not lead:
    return _read_slice(*parts[()], index, dtype)
  index = index if index is not None else (slice(None),) * len(shape)
  ranges = [range(*sl.indices(size)) for sl, size in zip(index[:lead], shape[:lead])]
  inner = tuple(len(range(*sl.indices(size))) for sl, size in zip(index[lead:], shape[lead:]))
  out = np.zeros([len(r) for r in ranges] + list(inner), dtype)
  for pos in np.ndindex(*out.shape[:lead]):
    at = tuple(r[p] for r, p in zip(ranges, pos))
    if at in parts:
      out[pos] = _read_slice(*parts[at], index[lead:], dtype)
  return out


def load_hf_model(path: str, mesh: Mesh | None = None, *, param_dtype: str | None = None,
                  dtype: str | None = None, lm_head_fp32: bool | None = None,
                  attention_impl: str | None = None,
                  rules: sharding.Rules = sharding.DEFAULT_RULES,
                  ) -> tuple[transformer.Transformer, ModelConfig]:
  """Loads a Hugging Face Llama/Qwen2/Qwen3/Qwen3-MoE directory into a model on `mesh`.

  Args:
    path: directory with config.json and model.safetensors (or shards + index.json).
    mesh: where the params go, sharded by `rules`; None puts them on the first device.
    param_dtype: parameter dtype ('float32' | 'bfloat16'); default: the checkpoint's.
    dtype: activation dtype; default: param_dtype.
    lm_head_fp32: the ScaleRL FP32-logits switch; default: ModelConfig's default (True).
    attention_impl: full-sequence attention ("auto", "einsum", "cudnn", "splash"); default:
      ModelConfig's ("auto").
    rules: logical-axis -> mesh-axis rules.

  Returns:
    (model, cfg). Missing/unexpected tensors, shape mismatches and unreadable files raise
    UserError naming the file and the tensor.
  """
  overrides: dict[str, Any] = {}
  if param_dtype is not None:
    overrides["param_dtype"] = param_dtype
  if dtype is not None or param_dtype is not None:
    overrides["dtype"] = dtype or param_dtype
  if lm_head_fp32 is not None:
    overrides["lm_head_fp32"] = lm_head_fp32
  if attention_impl is not None:
    overrides["attention_impl"] = attention_impl
  cfg = read_model_config(path, **overrides)
  wmap = _weight_map(path)
  entries = layout(cfg)
  wanted = {e.hf_key for e in entries}
  for key in sorted(wmap):
    tied_head = cfg.tie_embeddings and key == "lm_head.weight"
    if key not in wanted and not tied_head and not key.endswith(_IGNORED_SUFFIXES):
      raise UserError(f"{wmap[key]}: unexpected tensor '{key}' for a {cfg.family} model "
                      f"with {cfg.num_layers} layers (see {path}/config.json)")

  graphdef, abs_state = sharding.abstract_model(cfg)
  if mesh is None:
    target = SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: target, abs_state,
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
  else:
    shardings = sharding.state_shardings(abs_state, mesh, rules)
  shard_of = dict(nnx.to_flat_state(shardings))
  np_dtype = np.dtype(jnp.dtype(cfg.param_dtype))

  # Per param path: (handle, entry) of each HF tensor it is made of, by its stacked index.
  sources: dict[tuple[Any, ...], dict[tuple[int, ...], tuple[Any, _Entry]]] = {}
  arrays = {}
  with contextlib.ExitStack() as stack:
    handles: dict[str, Any] = {}
    for entry in entries:
      file_path = wmap.get(entry.hf_key)
      if file_path is None:
        raise UserError(f"{path}: tensor '{entry.hf_key}' is missing from the checkpoint")
      if file_path not in handles:
        handles[file_path] = stack.enter_context(_open(file_path))
      handle = handles[file_path]
      try:
        hf_shape = tuple(handle.get_slice(entry.hf_key).get_shape())
      except Exception:
        raise UserError(f"{file_path}: tensor '{entry.hf_key}' is missing (named in the index)"
                        ) from None
      if hf_shape != entry.hf_shape:
        raise UserError(f"{file_path}: tensor '{entry.hf_key}' has shape {list(hf_shape)}, "
                        f"config.json implies {list(entry.hf_shape)}")
      sources.setdefault(entry.path, {})[entry.lead] = (handle, entry)
    abs_flat = dict(nnx.to_flat_state(abs_state))
    for param_path, parts in sources.items():
      target = shard_of[param_path]
      target = target.get_value() if isinstance(target, nnx.Variable) else target
      shape = tuple(abs_flat[param_path].get_value().shape)
      arrays[param_path] = jax.make_array_from_callback(
          shape, target, lambda idx, ps=parts, s=shape: _read_param(ps, s, idx, np_dtype),
          dtype=np_dtype)

  flat = [(p, v.replace(arrays[p])) for p, v in nnx.to_flat_state(abs_state)]
  return nnx.merge(graphdef, nnx.from_flat_state(flat)), cfg


# ----------------------------------------------------------------------------------------
# Saving.


def _host_array(x: jax.Array) -> np.ndarray:
  if not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # only multi-host runs need it
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def _to_hf(arr: np.ndarray, entry: _Entry) -> np.ndarray:
  return np.ascontiguousarray(arr.transpose(np.argsort(entry.perm)).reshape(entry.hf_shape))


def save_hf_model(model: transformer.Transformer, cfg: ModelConfig, out_dir: str,
                  tokenizer_dir: str | None = None, max_shard_bytes: int = 4 * 2**30) -> None:
  """Writes `model` as a Hugging Face directory that transformers' from_pretrained loads.

  Tensors keep the params' dtype (config.json's torch_dtype says which). Above
  `max_shard_bytes` the weights split into model-0000i-of-0000n.safetensors plus an index.
  Tokenizer and generation-config files are copied from `tokenizer_dir` when given. Only
  process 0 writes; every process must call this (multi-host gathers are collective).
  """
  if tokenizer_dir is not None and not os.path.isdir(tokenizer_dir):
    raise UserError(f"{tokenizer_dir}: tokenizer directory not found")
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  entries = layout(cfg)
  itemsize = jnp.dtype(cfg.param_dtype).itemsize
  shards: list[list[_Entry]] = [[]]
  used = 0
  for entry in entries:
    size = math.prod(entry.hf_shape) * itemsize
    if shards[-1] and used + size > max_shard_bytes:
      shards.append([])
      used = 0
    shards[-1].append(entry)
    used += size
  writer = jax.process_index() == 0
  if writer:
    os.makedirs(out_dir, exist_ok=True)
  names = (["model.safetensors"] if len(shards) == 1 else
           [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
  weight_map, total = {}, 0
  for name, shard in zip(names, shards):
    tensors = {}
    for entry in shard:
      value = flat[entry.path].get_value()
      # One layer at a time, so the host never holds a whole stacked param.
      arr = _host_array(value[entry.lead] if entry.lead else value)
      tensors[entry.hf_key] = _to_hf(arr, entry)
      weight_map[entry.hf_key] = name
      total += tensors[entry.hf_key].nbytes
    if writer:
      save_file(tensors, os.path.join(out_dir, name), metadata={"format": "pt"})
  if not writer:
    return
  if len(shards) > 1:
    with open(os.path.join(out_dir, _INDEX), "w") as fh:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
  with open(os.path.join(out_dir, "config.json"), "w") as fh:
    json.dump(config_lib.to_hf_config(cfg), fh, indent=2)
  if tokenizer_dir is not None:
    for name in TOKENIZER_FILES:
      src = os.path.join(tokenizer_dir, name)
      if os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(
          os.path.join(out_dir, name)):
        shutil.copyfile(src, os.path.join(out_dir, name))
