"""Helpers for the backend tests: the model-making script, tiny repositories, an engine."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flowserve.dataplane.engine import Engine
from flowserve.runtime.registry import State

ROOT = Path(__file__).resolve().parents[3]
BUNDLED = ROOT / "model_repository"


def _load_make_models() -> ModuleType:
    path = ROOT / "tests" / "models" / "make_models.py"
    spec = importlib.util.spec_from_file_location("flowserve_make_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def make_models() -> ModuleType:
    return _load_make_models()


def write_model(repo: Path, name: str, config: str | None, files: dict[str, bytes] | None = None) -> Path:
    """A model directory: config.pbtxt (None: none at all) and files relative to it."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for rel, data in (files or {}).items():
        path = model_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return model_dir


def copy_bundled(repo: Path, *names: str) -> None:
    for name in names:
        shutil.copytree(BUNDLED / name, repo / name)


@asynccontextmanager
async def engine_for(*repos: Path) -> AsyncIterator[Engine]:
    engine = await Engine.start(list(repos))
    try:
        yield engine
    finally:
        await engine.stop()


def status(engine: Engine, name: str) -> tuple[State, str]:
    """(state, reason) of a model: READY, or UNAVAILABLE with every reason given for it."""
    if engine.registry.has(name):
        return State.READY, ""
    reasons = [s.reason for s in engine.registry.index() if s.name == name]
    issues = [i.message for i in engine.issues if name in str(i)]
    return State.UNAVAILABLE, "; ".join(reasons + issues)


def instance_of(engine: Engine, name: str) -> Any:
    """The first loaded instance of a model's backend node (a session, a module, ...)."""
    return backend_node(engine, name).pool.instances[0]


def backend_node(engine: Engine, name: str) -> Any:
    """A model's backend node (under its batcher, when it has one)."""
    node = engine.registry.get(name).executor.nodes[0]
    return getattr(node, "inner", node)


class Helpers:
    """The helpers above, for tests (conftest modules are not importable by name)."""

    write_model = staticmethod(write_model)
    copy_bundled = staticmethod(copy_bundled)
    engine_for = staticmethod(engine_for)
    status = staticmethod(status)
    instance_of = staticmethod(instance_of)
    backend_node = staticmethod(backend_node)
    BUNDLED = BUNDLED
    ROOT = ROOT


@pytest.fixture
def bk() -> type[Helpers]:
    return Helpers
