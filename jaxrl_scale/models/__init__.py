"""The policy model: an nnx Llama 3 / Qwen2 / Qwen3 decoder, its sharding, HF checkpoints I/O.

  config       ModelConfig, named presets, Hugging Face config.json conversion
  layers       RMSNorm, RoPE, GQA attention projections, paged KV attention, SwiGLU MLP
  attention    full-sequence causal attention: einsum path and the Pallas TPU kernel
  transformer  Transformer (stacked, scanned layers; full-sequence, prefill and paged
               decode paths; remat policies)
  kv_cache     the sampler's page pool: PagedKVCache, PromptPrefix, init_pages
  sharding     logical-axis rules, create_sharded_model, page pool shardings
  hf_io        load_hf_model / save_hf_model (safetensors, sharded, no unsharded copy)
  tokenizer    built-in byte tokenizer and Hugging Face tokenizers

Import the submodules (`from jaxrl_scale.models import transformer`); this file imports
nothing so that cheap callers (the CLI parser) do not pay for JAX.
"""
