"""benchmarks/sampler/: see its README.md."""
