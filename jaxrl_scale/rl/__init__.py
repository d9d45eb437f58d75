"""RL math: policy losses, loss aggregation, advantages and filters, the NPR curriculum.

Import the modules (`from jaxrl_scale.rl import losses`); each keeps its own registry of
functions by name (`losses.register_loss`, `aggregation.register_aggregation`,
`advantages.register_normalization`) so a fork adds one without touching the trainer.
"""
