"""Hugging Face checkpoints: parity with transformers, exact round trips, sharded loads, errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec as P
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config, hf_io

FAMILIES = ["llama", "qwen2", "qwen3", "qwen3_tied", "qwen3_moe", "qwen3_moe_step2"]


@nnx.jit
def _forward(model, tokens, positions, mask):
  return model(tokens, positions, mask)


def _logits(model, batch):
  return np.asarray(_forward(model, *(jnp.asarray(x) for x in batch)))


def _tensors(path):
  out = {}
  for name in os.listdir(path):
    if name.endswith(".safetensors"):
      out.update(load_file(os.path.join(path, name)))
  return out


def _mesh(shape):
  return jax.make_mesh(shape, ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:shape[0] * shape[1]])


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_with_left_and_right_padding(family, hf_checkpoints,
                                                               hf_helpers):
  path, hf_model = hf_checkpoints[family]
  model, cfg = hf_io.load_hf_model(path)
  assert cfg.family == hf_helpers.family_of[family]
  for left in (True, False):
    batch = hf_helpers.padded_batch(cfg.vocab_size, [9, 6, 2], 9, left=left, seed=int(left))
    ours, theirs = _logits(model, batch), hf_helpers.hf_logits(hf_model, *batch)
    mask = batch[2]
    np.testing.assert_allclose(ours[mask], theirs[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_load_save_round_trips_and_transformers_loads_it(family, hf_checkpoints, hf_helpers,
                                                         tmp_path):
  import transformers

  path, hf_model = hf_checkpoints[family]
  model, cfg = hf_io.load_hf_model(path)
  out = str(tmp_path / "out")
  # Small shards: the save must also write a correct index.
  hf_io.save_hf_model(model, cfg, out, tokenizer_dir=path, max_shard_bytes=100_000)
  assert os.path.exists(os.path.join(out, "model.safetensors.index.json"))
  assert os.path.exists(os.path.join(out, "generation_config.json"))
  original, saved = _tensors(path), _tensors(out)
  assert sorted(saved) == sorted(original)
  for key, value in original.items():
    assert saved[key].dtype == value.dtype, key
    np.testing.assert_array_equal(saved[key], value, err_msg=key)

  reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(
      out, output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  batch = hf_helpers.padded_batch(cfg.vocab_size, [7, 4], 7, left=False)
  np.testing.assert_allclose(hf_helpers.hf_logits(reloaded.eval(), *batch),
                             hf_helpers.hf_logits(hf_model, *batch), atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe"])
def test_sharded_load_matches_single_device(family, hf_checkpoints, hf_helpers, tmp_path):
  path, _ = hf_checkpoints[family]
  single, cfg = hf_io.load_hf_model(path)
  sharded, _ = hf_io.load_hf_model(path, mesh=_mesh((4, 2)))
  q = sharded.layers.self_attn.q_proj.kernel[...]
  assert q.sharding.spec == P(None, "fsdp", "tp", None)
  assert q.addressable_shards[0].data.shape == (cfg.num_layers, 16, 2, cfg.head_dim)
  assert sharded.embed_tokens.embedding[...].sharding.spec == P("tp", "fsdp")
  if cfg.num_experts:  # [L, E, D, F]: no expert mesh axis yet, so E is whole everywhere
    assert sharded.layers.moe.gate_proj[...].sharding.spec == P(None, None, "fsdp", "tp")
    assert sharded.layers.moe.down_proj[...].sharding.spec == P(None, None, "tp", "fsdp")
  # Every param equals the single-device one exactly; the forward within float tolerance.
  for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(sharded)),
                            nnx.to_flat_state(nnx.state(single))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()),
                                  err_msg=str(p))
  batch = hf_helpers.padded_batch(cfg.vocab_size, [9, 6, 2], 9, left=True)
  np.testing.assert_allclose(_logits(sharded, batch), _logits(single, batch), atol=1e-5, rtol=0)
  # Saving gathers the shards back into the original tensors.
  hf_io.save_hf_model(sharded, cfg, str(tmp_path))
  original, saved = _tensors(path), _tensors(str(tmp_path))
  assert sorted(saved) == sorted(original)
  for key, value in original.items():
    np.testing.assert_array_equal(saved[key], value, err_msg=key)


def test_transformers_sharded_checkpoint_with_index_loads(hf_checkpoints, hf_helpers, tmp_path):
  path, hf_model = hf_checkpoints["qwen2"]
  hf_model.save_pretrained(str(tmp_path), max_shard_size="100KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
  from_index, _ = hf_io.load_hf_model(str(tmp_path), mesh=_mesh((4, 1)))
  single, _ = hf_io.load_hf_model(path)
  for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(from_index)),
                            nnx.to_flat_state(nnx.state(single))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()),
                                  err_msg=str(p))


def test_bfloat16_checkpoint_round_trips_exactly(hf_helpers, tmp_path):
  import torch

  hf_model = hf_helpers.make_hf_model(hf_helpers.specs["qwen3"], seed=5).to(torch.bfloat16)
  src, out = str(tmp_path / "src"), str(tmp_path / "out")
  hf_model.save_pretrained(src)
  model, cfg = hf_io.load_hf_model(src)
  assert cfg.param_dtype == "bfloat16"
  assert model.layers.self_attn.q_proj.kernel[...].dtype == jnp.bfloat16
  hf_io.save_hf_model(model, cfg, out)
  with open(os.path.join(out, "config.json")) as fh:
    assert json.load(fh)["torch_dtype"] == "bfloat16"
  for name in (src, out):
    with safe_open(os.path.join(name, "model.safetensors"), framework="np") as f:
      assert f.get_slice("model.norm.weight").get_dtype() == "BF16"
  original, saved = _tensors(src), _tensors(out)
  assert sorted(saved) == sorted(original)
  for key in original:
    np.testing.assert_array_equal(saved[key].view(np.uint16), original[key].view(np.uint16))
  # A float32 override upcasts on load.
  model32, cfg32 = hf_io.load_hf_model(src, param_dtype="float32")
  assert cfg32.dtype == "float32" and model32.norm.scale[...].dtype == jnp.float32


def test_read_slice_handles_any_index_of_merged_head_dims(hf_checkpoints):
  path, _ = hf_checkpoints["qwen3"]
  cfg = config.from_hf_config(hf_io.read_hf_config(path))
  entries = {e.hf_key: e for e in hf_io.layout(cfg)}
  rng = np.random.default_rng(0)
  with safe_open(os.path.join(path, "model.safetensors"), framework="np") as f:
    for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight"):
      entry = entries[key]
      full = f.get_tensor(key).reshape([s for g in entry.groups for s in g]).transpose(entry.perm)
      for _ in range(5):
        index = []
        for dim in entry.shape:
          a = int(rng.integers(0, dim))
          index.append(slice(a, int(rng.integers(a + 1, dim + 1))))
        got = hf_io._read_slice(f, entry, tuple(index), np.dtype(np.float32))
        np.testing.assert_array_equal(got, full[tuple(index)], err_msg=f"{key} {index}")


@pytest.fixture
def broken_copy(hf_checkpoints, tmp_path):
  """A writable copy of the llama checkpoint."""
  path = tmp_path / "broken"
  shutil.copytree(hf_checkpoints["llama"][0], path)
  return path


def test_missing_tensor_names_key(broken_copy):
  weights = broken_copy / "model.safetensors"
  tensors = load_file(str(weights))
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, str(weights), metadata={"format": "pt"})
  with pytest.raises(UserError, match="'model.layers.1.mlp.up_proj.weight' is missing"):
    hf_io.load_hf_model(str(broken_copy))


def test_unexpected_tensor_names_key(broken_copy):
  weights = broken_copy / "model.safetensors"
  tensors = load_file(str(weights))
  tensors["model.layers.2.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, str(weights), metadata={"format": "pt"})
  with pytest.raises(UserError, match="unexpected tensor 'model.layers.2.mlp.up_proj.weight'"):
    hf_io.load_hf_model(str(broken_copy))


def test_shape_mismatch_names_file_and_key(broken_copy):
  cfg_path = broken_copy / "config.json"
  hf = json.loads(cfg_path.read_text())
  hf["intermediate_size"] = 96
  cfg_path.write_text(json.dumps(hf))
  with pytest.raises(UserError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\."
                     r"gate_proj\.weight' has shape \[128, 64\], config.json implies \[96, 64\]"):
    hf_io.load_hf_model(str(broken_copy))


def test_unreadable_files_name_the_file(broken_copy, tmp_path):
  (broken_copy / "model.safetensors").write_bytes(b"not a safetensors file")
  with pytest.raises(UserError, match="model.safetensors: cannot read safetensors"):
    hf_io.load_hf_model(str(broken_copy))
  (broken_copy / "config.json").write_text("{not json")
  with pytest.raises(UserError, match="config.json: unreadable"):
    hf_io.load_hf_model(str(broken_copy))
  with pytest.raises(UserError, match="config.json: not found"):
    hf_io.load_hf_model(str(tmp_path / "nowhere"))
  os.remove(broken_copy / "model.safetensors")
  (broken_copy / "config.json").write_text(json.dumps(config.to_hf_config(config.tiny_llama())))
  with pytest.raises(UserError, match=r"no \*\.safetensors"):
    hf_io.load_hf_model(str(broken_copy))


def test_save_rejects_missing_tokenizer_dir(tiny_model, tmp_path):
  with pytest.raises(UserError, match="tokenizer directory not found"):
    hf_io.save_hf_model(tiny_model("tiny_llama"), config.tiny_llama(), str(tmp_path / "o"),
                        tokenizer_dir=str(tmp_path / "missing"))


@pytest.mark.parametrize("left", [False, True])
def test_prefill_keys_and_values_match_transformers_cache(hf_checkpoints, hf_helpers, left):
  import torch

  path, hf_model = hf_checkpoints["llama"]  # llama: RoPE scaling touches the cached keys
  model, cfg = hf_io.load_hf_model(path)
  tokens, positions, mask = hf_helpers.padded_batch(cfg.vocab_size, [7, 4], 7, left=left)
  _, k_LBTKH, v_LBTKH = nnx.jit(lambda m, *a: m.prefill(*a))(
      model, *(jnp.asarray(x) for x in (tokens, positions, mask)))
  with torch.no_grad():
    cache = hf_model(input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions),
                     attention_mask=torch.tensor(mask.astype(np.int64)),
                     use_cache=True).past_key_values
  for i, layer in enumerate(cache.layers):  # HF keeps [B, K, T, H], RoPE applied
    hf_k = layer.keys.numpy().transpose(0, 2, 1, 3)
    hf_v = layer.values.numpy().transpose(0, 2, 1, 3)
    np.testing.assert_allclose(np.asarray(k_LBTKH[i])[mask], hf_k[mask], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(v_LBTKH[i])[mask], hf_v[mask], atol=1e-5, rtol=0)
