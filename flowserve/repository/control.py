"""Model control for code inside a model: ``pb_utils.load_model`` and ``unload_model``.

The repository hands every python model a :class:`ControlLink` (through its LoadSettings) when
it builds it, before the data plane that serves the repository exists; the data plane binds
itself to the link once it does, so a model's load goes through the same door as the load API:
the control mode decides whether it is allowed, and with several workers it happens in every
worker. Until one is bound (an engine used without a data plane), a call fails with a clear
error.
"""

from __future__ import annotations

from typing import Any

from flowserve.core.errors import Unavailable
from flowserve.nodes.loading import ModelControl


class ControlLink:
    def __init__(self) -> None:
        self.target: ModelControl | None = None

    def _bound(self, call: str) -> ModelControl:
        if self.target is None:
            raise Unavailable(f"{call} is not available: no server serves this engine's repository")
        return self.target

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> Any:
        return await self._bound("load_model").load_model(name, config, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> Any:
        return await self._bound("unload_model").unload_model(name, unload_dependents)


__all__ = ["ControlLink"]
