"""(name, version) -> Servable, with the state of everything the repositories hold."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from flowserve.core.errors import NotFound, Unavailable
from flowserve.runtime.servable import Servable
from flowserve.spec.schema import node_targets

# The reason of a model the repository holds but was never asked to load (explicit mode), with
# version "": the index lists it by name only, as Triton does, and a request for it is "not
# found". (An unloaded version keeps its version number and the same reason.)
NEVER_LOADED = "unloaded"


class State(enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class Status:
    name: str
    version: str
    state: State
    reason: str = ""


def _never_loaded(status: Status) -> bool:
    return not status.version and status.reason == NEVER_LOADED


class Registry:
    def __init__(self) -> None:
        self._servables: dict[str, dict[int, Servable]] = {}
        self._status: dict[tuple[str, str], Status] = {}
        # graph name -> (node, target) of its model and graph steps: a graph is ready only
        # while everything it uses is loaded
        self._uses: dict[str, tuple[tuple[str, str], ...]] = {}
        # every model and graph name the repositories hold right now, loaded or not (the
        # repository sets it: a fresh look at the disk, as Triton's index lists it per call)
        self.listing: Callable[[], Iterable[str]] = tuple

    def add(self, servable: Servable) -> None:
        self._servables.setdefault(servable.name, {})[servable.version] = servable
        uses = tuple(
            (n.name, target) for n in servable.plan.nodes for target in node_targets(n.spec, shadow=False)
        )
        if uses:
            self._uses[servable.name] = uses
        else:
            self._uses.pop(servable.name, None)
        key = (servable.name, str(servable.version))
        self._status[key] = Status(servable.name, str(servable.version), State.READY)
        self._status.pop((servable.name, ""), None)

    def replace(self, name: str, servables: list[Servable]) -> list[Servable]:
        """Swap every version of ``name`` for ``servables`` at once; returns the old ones."""
        old = list(self._servables.pop(name, {}).values())
        for key in [k for k in self._status if k[0] == name]:
            del self._status[key]
        for servable in servables:
            self.add(servable)
        return old

    def remove(self, name: str) -> list[Servable]:
        """Drop every version of ``name``; returns them (for the caller to stop)."""
        gone = list(self._servables.pop(name, {}).values())
        self._uses.pop(name, None)
        for key in [k for k in self._status if k[0] == name]:
            status = self._status[key]
            self._status[key] = Status(name, status.version, State.UNAVAILABLE, "unloaded")
        return gone

    def mark(self, name: str, version: str, state: State, reason: str = "") -> None:
        self._status[(name, version)] = Status(name, version, state, reason)

    def get(self, name: str, version: str = "") -> Servable:
        """The servable for (name, version); "" picks the highest loaded version."""
        # Triton's wording (model_lifecycle.cc) starts every one of these answers: clients test
        # for "Request for unknown model"; the reason flowserve knows follows it
        versions = self._servables.get(name)
        if not versions:
            status = self._failed_reason(name)
            if status is not None:
                raise Unavailable(
                    f"Request for unknown model: '{name}' has no available versions "
                    f"(model '{name}' is not ready: {status})"
                )
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if name in self._uses:
            missing = self.missing(name)
            if missing:
                raise Unavailable(f"model '{name}' is not ready: {missing}")
        if not version:
            return versions[max(versions)]
        try:
            return versions[int(version)]
        except (ValueError, KeyError):
            known = self._status.get((name, version))
            if known is not None and known.state is not State.READY:
                raise Unavailable(
                    f"Request for unknown model: '{name}' version {version} is not at ready state "
                    f"({known.reason or known.state.value})"
                ) from None
            raise NotFound(
                f"Request for unknown model: '{name}' version {version} is not found (loaded: "
                f"{', '.join(str(v) for v in sorted(versions))})"
            ) from None

    def missing(self, name: str) -> str:
        """Why graph ``name`` cannot run: a model or graph it uses is not loaded ("" if none)."""
        for node, target in self._uses.get(name, ()):
            if not self._servables.get(target):
                return f"node '{node}' uses '{target}', which is not loaded"
            inner = self.missing(target)
            if inner:
                return f"node '{node}' uses '{target}', which is not ready ({inner})"
        return ""

    def _failed_reason(self, name: str) -> str | None:
        for (n, _), status in self._status.items():
            if n == name and status.state is not State.READY and not _never_loaded(status):
                return status.reason or status.state.value
        return None

    def never_loaded(self, name: str) -> bool:
        """Whether ``name`` is known only as a model the repository holds and nobody loaded."""
        statuses = [s for (n, _), s in self._status.items() if n == name]
        return bool(statuses) and all(_never_loaded(s) for s in statuses)

    def has(self, name: str) -> bool:
        return bool(self._servables.get(name))

    def ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except (NotFound, Unavailable):
            return False
        return True

    def servables(self) -> list[Servable]:
        return [s for versions in self._servables.values() for s in versions.values()]

    def versions(self, name: str) -> list[int]:
        return sorted(self._servables.get(name, {}))

    def index(self) -> list[Status]:
        out = []
        for status in self._status.values():
            if status.state is State.READY and status.name in self._uses:
                missing = self.missing(status.name)
                if missing:
                    status = Status(status.name, status.version, State.UNAVAILABLE, missing)
            out.append(status)
        return sorted(out, key=lambda s: (s.name, s.version))
