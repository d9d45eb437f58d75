"""benchmarks/peers/: side by side with Tunix and TRL on the same checkpoint (peers.py)."""
