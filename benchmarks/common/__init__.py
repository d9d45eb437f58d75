"""benchmarks/common/: see its README.md."""
