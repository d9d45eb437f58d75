"""Generation: the JAX sampler (KV cache, continuous batching, fp32 logprobs, forced
interruption, in-flight weight swaps) and the `jaxrl-scale generate` command.

Modules are imported directly (`from jaxrl_scale.generation import engine`): this package
imports nothing itself, so the CLI can load `generation.command` without loading JAX.
"""
