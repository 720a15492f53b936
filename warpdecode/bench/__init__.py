"""Benchmark harness: side-by-side runs of warpdecode and peer implementations on the same weights."""
