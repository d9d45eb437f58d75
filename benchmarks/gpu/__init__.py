"""benchmarks/gpu/: see its README.md."""
