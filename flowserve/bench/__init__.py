"""``flowserve bench``: a load generator for any model or graph, over HTTP, gRPC or in-process.

    results = bench(BenchOptions("simple", protocol="grpc", levels=levels([1, 8])))

Closed loop at given concurrencies or open loop at a request rate; inputs from the model's
metadata (random or zero), or samples from a JSON/NumPy file; throughput and p50/p90/p99.
A top-level tool like the CLI: the server never imports it.
"""

from flowserve.bench.load import Level
from flowserve.bench.run import BenchOptions, bench, bench_async, levels
from flowserve.bench.stats import LevelResult

__all__ = ["BenchOptions", "Level", "LevelResult", "bench", "bench_async", "levels"]
