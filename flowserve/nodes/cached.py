"""A node answered from the response cache: identical inputs return the stored outputs without
running the node (YAML ``cache: true`` on a node; the server's ``--cache-size`` pool)."""

from __future__ import annotations

from flowserve.core.node import Context, Node, TensorMap
from flowserve.runtime.cache import ResponseCache, cache_key
from flowserve.runtime.stats import NodeStats


class CachedNode(Node):
    def __init__(self, inner: Node, cache: ResponseCache, key: str) -> None:
        self.name = inner.name
        self.inner = inner
        self.partial_outputs = inner.partial_outputs
        self.cache = cache
        self.key = key
        inner_stats = getattr(inner, "node_stats", None)
        self.node_stats = inner_stats if isinstance(inner_stats, NodeStats) else NodeStats()

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        key = cache_key(self.key, 0, inputs)
        hit = self.cache.get(key)
        if hit is not None:
            self.node_stats.cache_hits += 1
            return hit
        self.node_stats.cache_misses += 1
        outputs = await self.inner(inputs, ctx)
        self.cache.put(key, outputs)
        return outputs

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()
