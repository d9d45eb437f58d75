"""benchmarks/rewards/: see its README.md."""
