"""benchmarks/demos/: see its README.md."""
