"""Third-party backends (see :mod:`flowserve.nodes.backends.api`): entry-point discovery, the
backend-level lifecycle, and the adapter that makes a plugin a :class:`BackendNode`, so
batching, instances, statistics, reshape and warmup apply to it unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.datatypes import from_config
from flowserve.core.errors import FlowserveError, InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends import api
from flowserve.nodes.backends._support import placement
from flowserve.nodes.backends.base import BackendNode
from flowserve.nodes.loading import LoadSettings
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import InstanceSpec, ModelSpec, TensorSpec
from flowserve.spec.triton import Completion, config_to_json

log = logging.getLogger("flowserve.plugins")

# the prefix of a plugin's entry in BACKENDS ("plugin:<module>:<attr>")
PLUGIN_PREFIX = "plugin:"


@dataclass(frozen=True, slots=True)
class PluginSource:
    """Where a plugin backend comes from, for messages."""

    name: str
    value: str
    distribution: str

    def describe(self) -> str:
        return f"plugin {self.distribution} (entry point '{self.name} = {self.value}')"


SOURCES: dict[str, PluginSource] = {}


def discover(builtins: dict[str, str]) -> dict[str, PluginSource]:
    """Read the ``flowserve.backends`` entry points (metadata only) into ``builtins`` as
    ``plugin:`` targets; returns the plugins found. A name taken by a built-in is skipped."""
    found: dict[str, PluginSource] = {}
    for ep in metadata.entry_points(group=api.ENTRY_POINT_GROUP):
        dist = ep.dist
        label = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "(unknown distribution)"
        source = PluginSource(ep.name, ep.value, label)
        target = builtins.get(ep.name)
        if target is not None and not target.startswith(PLUGIN_PREFIX):
            log.warning("ignoring %s: '%s' is a built-in backend", source.describe(), ep.name)
            continue
        if ep.name in found:
            log.warning(
                "%s and %s both name backend '%s'; using the first",
                found[ep.name].describe(),
                source.describe(),
                ep.name,
            )
            continue
        found[ep.name] = source
        SOURCES[ep.name] = source
        builtins[ep.name] = PLUGIN_PREFIX + ep.value
    return found


def source_of(backend: str, target: str) -> PluginSource:
    return SOURCES.get(backend) or PluginSource(
        backend, target.removeprefix(PLUGIN_PREFIX), "(registered in code)"
    )


def load_plugin(backend: str, target: str, model: str) -> Any:
    """Import a plugin's backend class; Unsupported naming the plugin if that fails."""
    source = source_of(backend, target)
    module_name, _, attr = target.removeprefix(PLUGIN_PREFIX).partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
    except Exception as exc:
        raise Unsupported(
            f"model '{model}': backend '{backend}' cannot be loaded from {source.describe()}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not callable(getattr(obj, "create_model", None)):
        raise Unsupported(
            f"model '{model}': backend '{backend}' from {source.describe()} is not a flowserve backend "
            "(it has no create_model; see flowserve.nodes.backends.api)"
        )
    why = api.compatible(getattr(obj, "api_version", None))
    if why:
        raise Unsupported(
            f"model '{model}': backend '{backend}' from {source.describe()} cannot be used: {why}"
        )
    return obj


_CLASSES: dict[tuple[str, str], type[BackendNode]] = {}


def node_class(backend: str, target: str, model: str) -> type[BackendNode]:
    """The BackendNode class that runs plugin ``backend`` (made once per plugin)."""
    key = (backend, target)
    cls = _CLASSES.get(key)
    if cls is None:
        factory = load_plugin(backend, target, model)
        attrs = getattr(factory, "attributes", api.BackendAttributes())
        if not isinstance(attrs, api.BackendAttributes):
            raise Unsupported(
                f"model '{model}': backend '{backend}' from {source_of(backend, target).describe()}: "
                "attributes must be a BackendAttributes"
            )
        namespace = {
            "backend_name": backend,
            "source": source_of(backend, target),
            "factory": factory,
            "attributes": attrs,
            "inline_ok": attrs.inline_ok,
            "parallel_instance_loading": attrs.parallel_instance_loading,
        }
        cls = _CLASSES[key] = type(f"PluginBackend[{backend}]", (PluginBackendNode,), namespace)
    return cls


# ---------------------------------------------------------------- backend-level lifecycle


class BackendHost:
    """One backend object per plugin per process: initialized when its first model loads,
    finalized when its last model unloads (engine shutdown unloads them all)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, tuple[Any, int]] = {}

    def acquire(self, backend: str, factory: Any, source: PluginSource, model: str) -> Any:
        with self._lock:
            live = self._live.get(backend)
            if live is not None:
                self._live[backend] = (live[0], live[1] + 1)
                return live[0]
            obj = call(
                lambda: factory() if isinstance(factory, type) else factory,
                backend,
                source,
                model,
                "construct",
            )
            call(obj.initialize, backend, source, model, "initialize")
            self._live[backend] = (obj, 1)
            return obj

    def release(self, backend: str) -> None:
        with self._lock:
            live = self._live.get(backend)
            if live is None:
                return
            obj, users = live
            if users > 1:
                self._live[backend] = (obj, users - 1)
                return
            del self._live[backend]
        try:
            obj.finalize()
        except Exception:
            log.exception("backend '%s': finalize() raised", backend)

    def live(self, backend: str) -> Any | None:
        entry = self._live.get(backend)
        return None if entry is None else entry[0]


HOST = BackendHost()


def call(fn: Any, backend: str, source: PluginSource, model: str | None, what: str, *args: Any) -> Any:
    """Call plugin code; its errors keep their code and name the backend and plugin (and the
    model, unless ``model`` is None: request errors are named by the executor already)."""
    where = f"model '{model}': backend '{backend}'" if model is not None else f"backend '{backend}'"
    try:
        return fn(*args)
    except FlowserveError as exc:
        try:
            error = type(exc)(f"{where} {what}: {exc.message}")
        except TypeError:
            error = InternalError(f"{where} {what}: {exc.message}")
        raise error from exc
    except Exception as exc:
        raise InternalError(
            f"{where} ({source.describe()}) {what} raised {type(exc).__name__}: {exc}"
        ) from exc


# ---------------------------------------------------------------- the adapter


class PluginBackendNode(BackendNode):
    """Runs a plugin's models and instances behind the BackendNode contract."""

    backend_name: str = ""
    source: PluginSource
    factory: Any = None
    attributes: api.BackendAttributes = api.BackendAttributes()

    def __init__(
        self,
        model: ModelSpec,
        version: int,
        stats: ModelStats,
        clock: Clock = MONOTONIC,
        registry: Registry | None = None,
        load: LoadSettings | None = None,
    ) -> None:
        if not model.instances:
            preferred = self.attributes.preferred_instance_kind
            group = InstanceSpec(
                count=max(self.attributes.preferred_instance_count, 1),
                kind="KIND_AUTO" if preferred == "KIND_GPU" else preferred,
            )
            model = replace(model, instances=(group,))
        super().__init__(model, version, stats, clock, registry, load)
        self._backend: Any = None
        self._model: Any = None

    def _call(self, fn: Any, what: str, *args: Any) -> Any:
        return call(fn, self.backend_name, self.source, self.name, what, *args)

    def _call_for_request(self, fn: Any, what: str, *args: Any) -> Any:
        return call(fn, self.backend_name, self.source, None, what, *args)

    async def start(self) -> None:
        if self.model.max_batch_size > 0 and not self.attributes.batching:
            raise Unsupported(
                f"model '{self.name}': backend '{self.backend_name}' does not batch; set max_batch_size: 0"
            )
        self._backend = await asyncio.to_thread(
            HOST.acquire, self.backend_name, self.factory, self.source, self.name
        )
        try:
            self._model = await asyncio.to_thread(
                self._call, self._backend.create_model, "create_model", self.info()
            )
            await super().start()
        except BaseException:
            await self._release()
            raise

    async def stop(self) -> None:
        await super().stop()
        await self._release()

    async def _release(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(model.finalize)
        if self._backend is not None:
            self._backend = None
            await asyncio.to_thread(HOST.release, self.backend_name)

    def info(self) -> api.ModelInfo:
        m = self.model
        path = Path(self.version_path)
        return api.ModelInfo(
            name=m.name,
            version=self.version,
            version_path=path,
            model_path=path.parent,
            max_batch_size=m.max_batch_size,
            inputs=tuple(_tensor_info(t) for t in m.inputs),
            outputs=tuple(_tensor_info(t) for t in m.outputs),
            parameters=dict(m.parameters),
            default_model_filename=m.default_model_filename,
            config=config_to_json(m.config),
        )

    def load_instance(self, index: int) -> Any:
        place = placement(self.model, index, self.backend_name)
        info = api.InstanceInfo(
            model=self.info(),
            index=index,
            name=f"{self.name}_{index}",
            kind=place.kind,
            device_id=place.device,
        )
        return self._call(self._model.create_instance, "create_instance", info)

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        return self._run(instance, [inputs])[0]

    def execute_batch(self, instance: Any, batch: list[TensorMap]) -> list[TensorMap]:
        if self.attributes.merge_requests:
            return super().execute_batch(instance, batch)
        return self._run(instance, batch)

    def _run(self, instance: Any, requests: list[TensorMap]) -> list[TensorMap]:
        results = self._call_for_request(instance.execute, "execute", requests)
        if not isinstance(results, list | tuple) or len(results) != len(requests):
            got = len(results) if isinstance(results, list | tuple) else type(results).__name__
            raise InternalError(
                f"backend '{self.backend_name}' execute() returned {got} responses "
                f"for {len(requests)} requests"
            )
        return [{str(k): np.asarray(v) for k, v in dict(r).items()} for r in results]

    def unload_instance(self, instance: Any) -> None:
        fin = getattr(instance, "finalize", None)
        if fin is not None:
            self._call(fin, "finalize")


def _tensor_info(t: TensorSpec) -> api.TensorInfo:
    return api.TensorInfo(t.name, t.datatype, t.dims, t.optional)


# ---------------------------------------------------------------- auto-complete


def plugin_autocomplete(backend: str, builtins: dict[str, str]) -> Any:
    """An auto-complete hook for plugin ``backend`` that imports it only when called."""

    def hook(config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> Completion | None:
        target = builtins.get(backend, "")
        obj = load_plugin(backend, target, model_dir.name)
        method = getattr(obj, "auto_complete", None)
        if method is None:
            return None
        result = call(
            method,
            backend,
            source_of(backend, target),
            model_dir.name,
            "auto_complete",
            config_to_json(config),
            version_dirs,
        )
        return None if result is None else completion_from(result, model_dir.name, backend)

    return hook


def completion_from(result: Any, model: str, backend: str) -> Completion:
    """A plugin's auto-complete dict as a Completion."""
    if not isinstance(result, dict):
        raise InvalidArgument(
            f"model '{model}': backend '{backend}' auto_complete must return a dict or None"
        )

    def tensors(key: str) -> list[TensorSpec]:
        out = []
        for item in result.get(key, []):
            out.append(
                TensorSpec(
                    name=str(item["name"]),
                    datatype=from_config(str(item["data_type"])),
                    dims=tuple(int(d) for d in item.get("dims", [])),
                    optional=bool(item.get("optional", False)),
                )
            )
        return out

    try:
        max_batch = result.get("max_batch_size")
        return Completion(
            inputs=tensors("input"),
            outputs=tensors("output"),
            max_batch_size=None if max_batch is None else int(max_batch),
            dynamic_batching=bool(result.get("dynamic_batching", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"model '{model}': backend '{backend}' auto_complete returned an invalid entry: {exc!r}"
        ) from None
