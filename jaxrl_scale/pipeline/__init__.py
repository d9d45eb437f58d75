"""The RL pipeline between generator and trainer: rollouts, queue, staleness, modes, loop.

Import the modules (`from jaxrl_scale.pipeline import queue`). Layering: pipeline/ uses
generation/, rl/, rewards/ and data/; only `jaxrl_scale.train` sits above it.
"""
