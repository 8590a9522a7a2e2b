"""Micro-benchmarks of our ZeRO implementation's hot paths (pytest-benchmark).

The default test run executes each once, untimed (``--benchmark-disable`` in pyproject's addopts),
so what they assert is tested on every commit; the nightly job times them with
``pytest tests/benchmarks -n 0 --benchmark-enable --benchmark-only`` and fails on a median 20% slower
than the previous night's saved run.
"""
