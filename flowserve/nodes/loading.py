"""How much loading runs at once (Triton's ``--model-load-thread-count``, default 4).

The engine loads models that do not depend on each other concurrently, at most
``load_threads`` at a time, and a backend that allows parallel instance loading
(``BackendNode.parallel_instance_loading``) creates up to ``load_threads`` of its instances at
once, each on its own instance thread. The engine publishes its setting for the duration of a
load through :data:`LOAD_THREADS` (a context variable, so concurrent engines and loads do not
see each other's); outside a load it reads as the default.
"""

from __future__ import annotations

from contextvars import ContextVar

DEFAULT_LOAD_THREADS = 4

LOAD_THREADS: ContextVar[int] = ContextVar("flowserve_load_threads", default=DEFAULT_LOAD_THREADS)


def load_threads() -> int:
    """The loading concurrency in effect here (>= 1)."""
    return max(LOAD_THREADS.get(), 1)


def load_waves(order: list[str], deps: dict[str, set[str]]) -> list[list[str]]:
    """Split a dependency order into waves whose members use nothing of their own wave:
    everything in a wave can load at once once the earlier waves are loaded. Names keep their
    relative order inside a wave. Pure; ``deps[name]`` may name things outside ``order``."""
    level: dict[str, int] = {}
    for name in order:
        below = [level[d] for d in deps.get(name, set()) if d in level]
        level[name] = 1 + max(below) if below else 0
    waves: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for name in order:
        waves[level[name]].append(name)
    return waves
