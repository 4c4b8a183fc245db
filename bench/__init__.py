"""Benchmarks (not tests): run them from the repository root, e.g. `.venv/bin/python bench/ddp_overhead.py`."""
