"""benchmarks/plan/: see its README.md."""
