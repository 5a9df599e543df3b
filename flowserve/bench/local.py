"""In-process load: the engine runs in the benchmark's own process (no transport at all), so
the numbers are the engine's alone, the protocol stack left out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flowserve.bench.http import RequestFailed
from flowserve.bench.inputs import Sample
from flowserve.bench.model import ModelInfo, model_info
from flowserve.core.errors import FlowserveError
from flowserve.dataplane.engine import Engine
from flowserve.dataplane.metadata import model_config, model_metadata


async def start_engine(repositories: Sequence[Path], graphs: Sequence[Path]) -> Engine:
    from flowserve.repository.repository import add_import_roots

    add_import_roots([g if g.is_dir() else g.parent for g in graphs])
    return await Engine.start(list(repositories), list(graphs))


def describe(engine: Engine, model: str, version: str = "") -> ModelInfo:
    try:
        servable = engine.registry.get(model, version)
    except FlowserveError as exc:
        raise RequestFailed(f"in-process: {exc}") from None
    return model_info(model, model_metadata(engine.registry, servable), model_config(servable))


class LocalSession:
    def __init__(self, engine: Engine, model: str, version: str, samples: list[Sample]) -> None:
        self.engine = engine
        self.model = model
        self.version = version
        self.samples = samples

    async def send(self, index: int) -> None:
        try:
            await self.engine.infer(self.model, self.samples[index], version=self.version)
        except FlowserveError as exc:
            raise RequestFailed(f"{exc.code.name}: {exc}") from None

    def close(self) -> None:
        pass


class LocalClient:
    def __init__(self, engine: Engine, model: ModelInfo, samples: list[Sample], version: str = "") -> None:
        self.engine = engine
        self.model = model.name
        self.version = version
        self.samples = samples

    async def session(self) -> LocalSession:
        return LocalSession(self.engine, self.model, self.version, self.samples)

    async def close(self) -> None:
        pass


__all__ = ["LocalClient", "LocalSession", "describe", "start_engine"]
