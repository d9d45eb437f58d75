"""Sigmoidal compute-performance curves (ScaleRL, arXiv 2510.13786): fits, bootstrap
intervals, forecasts, recipe comparison, plots, the live forecaster and `jaxrl-scale fit`.

Kept import-free: `jaxrl_scale.scaling.command` is imported whenever the CLI parser is built,
and this file runs first. Import the modules you need, e.g.
`from jaxrl_scale.scaling import fit`.
"""
