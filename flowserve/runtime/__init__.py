"""Layer 3: runs plans. Pure dataflow state, the asyncio executor, the registry, statistics."""
