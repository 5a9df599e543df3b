"""What the node objects of one load are built with, and how much loading runs at once.

The repository loads models that do not depend on each other concurrently, at most
``load_threads`` at a time (Triton's ``--model-load-thread-count``), and a backend that allows
parallel instance loading (``BackendNode.parallel_instance_loading``) creates up to
``load_threads`` of its instances at once, each on its own instance thread. The repository hands
its :class:`LoadSettings` to every node it builds (``nodes/factory.py`` ``build_nodes``), so two
engines in one process never see each other's settings and nothing is read from a global.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flowserve.nodes.ratelimit import RateLimiter


class ModelControl(Protocol):
    """Model control for code inside a model (``pb_utils.load_model``/``unload_model``): the
    server's, with its policy (control mode; with several workers, every worker)."""

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> Any: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> Any: ...


@dataclass(frozen=True, slots=True)
class LoadSettings:
    load_threads: int = 4
    # Python work runs on the event loop while its calls take less than this (nodes/instances.py)
    inline_threshold_us: float = 1000.0
    # Triton's rate limiter, when the server has one (nodes/ratelimit.py)
    rate_limiter: RateLimiter | None = None
    # model control for python models (pb_utils.load_model), when the server hands one over
    model_control: ModelControl | None = None
    # the Ray cluster KIND_RAY instances are placed on ("": none configured; nodes/rayinstances.py)
    ray_address: str = ""

    @property
    def inline_threshold_ns(self) -> int:
        return int(self.inline_threshold_us * 1000)


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
