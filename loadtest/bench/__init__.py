"""Benchmarks and GPU tools beside the load tests: they measure the replica library (worker/) from
outside it, and nothing in the product imports them. `python -m loadtest.bench` runs engine_bench; the
others run as `python -m loadtest.bench.<module>`."""
