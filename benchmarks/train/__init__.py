"""benchmarks/train/: see its README.md."""
