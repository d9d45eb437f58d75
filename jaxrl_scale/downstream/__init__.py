"""Downstream benchmark evals (AIME-style math, LiveCodeBench-style code): mean@k and
unbiased pass@k, and the `jaxrl-scale eval` command.

Modules are imported directly (`from jaxrl_scale.downstream import benchmarks`): this
package imports nothing itself, so the CLI can load `downstream.command` cheaply.
"""
