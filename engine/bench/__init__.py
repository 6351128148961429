"""Benchmarks: the prompt suite across methods, transformers reference rows, batch sweeps and the cost model."""
