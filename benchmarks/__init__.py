"""The benchmarks, grouped by what they measure (benchmarks/README.md).

A package so that a script run by path (`python benchmarks/sampler/sampler_bench.py`, from
anywhere) and a test import each other's modules by one name, `benchmarks.<group>.<module>`:
each script puts the repository root first on `sys.path`, then imports absolutely.
"""
