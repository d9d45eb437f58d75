"""benchmarks/forecast/: see its README.md."""
