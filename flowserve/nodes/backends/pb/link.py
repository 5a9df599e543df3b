"""How model.py reaches the engine that serves it (BLS, readiness, model control): a link per
instance thread, and what ``initialize``/``finalize`` may not do."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flowserve.core.node import TensorMap
from flowserve.nodes.backends.pb.errors import TritonModelException


@dataclass
class BlsCall:
    """One BLS request as the engine needs it."""

    model: str
    version: str
    inputs: TensorMap
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""
    timeout_us: int = 0


class BlsLink(Protocol):
    """How a python model reaches its engine: BLS calls, model readiness and control."""

    def submit(self, call: BlsCall) -> concurrent.futures.Future[TensorMap]:
        """Run one request to its single response."""
        ...

    def stream(self, call: BlsCall, put: Callable[[TensorMap], None]) -> concurrent.futures.Future[bool]:
        """Run one request, calling ``put`` with each response (from the engine's loop); the
        future ends with whether the model was decoupled."""
        ...

    def is_model_ready(self, name: str, version: str) -> bool: ...

    def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None: ...

    def unload_model(self, name: str, unload_dependents: bool) -> None: ...


_local = threading.local()
_default_link: BlsLink | None = None

_NO_BLS = "BLS is only supported during the 'execute' function."


def set_link(link: BlsLink | None, default: bool = False) -> None:
    """Give the calling thread (and, with ``default``, threads that have none) a BLS link."""
    global _default_link
    _local.link = link
    if default:
        _default_link = link


def current_link() -> BlsLink | None:
    return getattr(_local, "link", None) or _default_link


class outside_execute:  # noqa: N801 - used as a context manager, named like one
    """While model.py's ``initialize``/``finalize`` runs on this thread: BLS is refused (as in
    Triton) and ``get_model_dir`` answers the model's directory."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir

    def __enter__(self) -> None:
        self._saved = (getattr(_local, "refuse_bls", False), getattr(_local, "model_dir", None))
        _local.refuse_bls = True
        _local.model_dir = self.model_dir

    def __exit__(self, *_: object) -> None:
        _local.refuse_bls, _local.model_dir = self._saved


def set_model_dir(model_dir: str | None) -> None:
    """The directory ``get_model_dir()`` answers on this thread (its model's version dir)."""
    _local.model_dir = model_dir


def get_model_dir() -> str:
    """The directory of the model.py being run (its version directory), as Triton's stub."""
    model_dir = getattr(_local, "model_dir", None) or _default_model_dir
    if model_dir is None:
        raise TritonModelException("get_model_dir() works only inside a model that flowserve serves")
    return str(model_dir)


_default_model_dir: str | None = None


def _need_link(call: str) -> BlsLink:
    link = current_link()
    if link is None:
        raise TritonModelException(f"{call} works only inside a model that a flowserve engine serves")
    return link
