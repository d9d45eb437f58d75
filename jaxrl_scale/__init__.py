"""jaxrl_scale: ScaleRL on JAX."""
