"""Load everything ``flowserve serve`` would load, once, and tell what failed (``flowserve
validate``, unless ``--no-load``): model files opened, Python models and nodes imported and
initialized, graphs warmed up, exactly as serving would, then everything is stopped again.

What the static pass (scan and compile) already reported is not reported again: ``skip`` names
the models and graphs it found broken.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flowserve.repository.repository import Repository
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.registry import State


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """One model version or graph that failed to load: where it is defined and why."""

    source: str  # its config file (or model folder) or graph file
    kind: str  # "model" or "graph"
    name: str
    version: str
    reason: str

    def __str__(self) -> str:
        version = f" version {self.version}" if self.kind == "model" and self.version else ""
        return f"{self.source}: {self.kind} '{self.name}'{version} failed to load: {self.reason}"


@dataclass
class LoadReport:
    """What loaded, what failed, and what is not ready only because it uses what failed."""

    loaded: list[str]
    failures: list[LoadFailure]
    blocked: list[str]


async def load_check(
    repositories: Sequence[Path | str],
    graphs: Sequence[Path],
    skip: Iterable[str] = (),
    settings: RepositorySettings | None = None,
) -> LoadReport:
    """Load every model and graph of ``repositories`` and ``graphs`` as the server does at
    start, then stop them all; returns what loaded and each failure not in ``skip``."""
    repository = Repository(list(repositories), list(graphs), settings or RepositorySettings())
    skipped = set(skip)
    try:
        await repository.open(poll=False)
        failures = []
        loaded: set[str] = set()
        blocked: set[str] = set()
        for status in repository.registry.index():
            if status.state is State.READY:
                loaded.add(status.name)
                continue
            if repository.registry.missing(status.name):
                blocked.add(status.name)  # its own failure is the one reported
                continue
            if status.name in skipped or status.state is not State.UNAVAILABLE:
                continue
            model = repository.models.get(status.name)
            graph = repository.graphs.get(status.name)
            source = model.source if model is not None else graph.source if graph is not None else ""
            kind = "model" if model is not None else "graph"
            failures.append(LoadFailure(source, kind, status.name, status.version, status.reason))
    finally:
        await repository.stop()
    failed = {f.name for f in failures}
    return LoadReport(sorted(loaded - failed - blocked), failures, sorted(blocked - failed))


__all__ = ["LoadFailure", "LoadReport", "load_check"]
