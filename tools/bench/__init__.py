"""Benchmarks, each a module run from the repository root: `.venv/bin/python -m tools.bench.NAME --help`."""
