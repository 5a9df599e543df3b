"""Triton-shaped answers for metadata, configuration, statistics and the repository index.

Plain dicts in the JSON shapes of Triton's HTTP API; the gRPC front end fills its protobuf
messages from the same dicts, so both transports report the same facts.
"""

from __future__ import annotations

from typing import Any

from flowserve.runtime.registry import NEVER_LOADED, Registry
from flowserve.runtime.servable import Servable
from flowserve.runtime.stats import Duration, ModelStats
from flowserve.spec.triton import config_to_json

# Server metadata names the protocol, not the program: Triton's own clients and examples test
# `name == "triton"` (simple_*_health_metadata.py), so flowserve answers as a Triton-protocol
# server; "version" is flowserve's own, and the extension "flowserve" tells clients which
# implementation answers (IMPLEMENTATION), for those that want to know.
SERVER_NAME = "triton"
IMPLEMENTATION = "flowserve"

# The protocol extensions this server implements (reported by server metadata).
EXTENSIONS = [
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
    IMPLEMENTATION,
]


def extensions(cuda_shared_memory: bool = False) -> list[str]:
    """The extensions to report: ``cuda_shared_memory`` too where CUDA shared memory works."""
    if not cuda_shared_memory:
        return EXTENSIONS
    at = EXTENSIONS.index("system_shared_memory") + 1
    return [*EXTENSIONS[:at], "cuda_shared_memory", *EXTENSIONS[at:]]


def server_metadata(version: str, extensions: list[str] | None = None) -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": version, "extensions": extensions or EXTENSIONS}


def model_metadata(registry: Registry, servable: Servable) -> dict[str, Any]:
    return {
        "name": servable.name,
        "versions": [str(v) for v in registry.versions(servable.name)],
        "platform": servable.platform,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.dims)}
            for t in servable.plan.inputs.values()
        ],
        "outputs": [
            {"name": o.name, "datatype": o.tensor.datatype, "shape": list(o.tensor.dims)}
            for o in servable.plan.outputs
        ],
    }


def model_config(servable: Servable) -> dict[str, Any]:
    return config_to_json(servable.config)


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def model_stats(servable: Servable) -> dict[str, Any]:
    s: ModelStats = servable.stats
    return {
        "name": servable.name,
        "version": str(servable.version),
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(s.success),
            "fail": _duration(s.fail),
            "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input),
            "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output),
            "cache_hit": _duration(s.cache_hit),
            "cache_miss": _duration(s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(b.compute_input),
                "compute_infer": _duration(b.compute_infer),
                "compute_output": _duration(b.compute_output),
            }
            for size, b in sorted(s.batches.items())
        ],
        "memory_usage": [],
    }


def statistics(registry: Registry, name: str = "", version: str = "") -> dict[str, Any]:
    """Statistics of one model (and version), or of every loaded one when ``name`` is empty."""
    if name:
        if version:
            servables = [registry.get(name, version)]
        else:
            registry.get(name)  # raises NotFound / Unavailable
            servables = [registry.get(name, str(v)) for v in registry.versions(name)]
    else:
        servables = sorted(registry.servables(), key=lambda s: (s.name, s.version))
    return {"model_stats": [model_stats(s) for s in servables]}


def repository_index(registry: Registry, ready_only: bool = False) -> list[dict[str, str]]:
    """Triton's index: every model directory (and graph) the repositories hold now, whether
    loaded or not; one entry per version it knows a state for, and a name-only entry for one
    never loaded (Triton's ``{"name": ...}``). ``ready_only``: READY versions only."""
    out = []
    known = set()
    for status in registry.index():
        known.add(status.name)
        if ready_only and status.state.value != "READY":
            continue
        if status.reason == NEVER_LOADED and not status.version:
            out.append({"name": status.name})
            continue
        entry = {"name": status.name, "version": status.version, "state": status.state.value}
        if status.reason:
            entry["reason"] = status.reason
        out.append(entry)
    if not ready_only:
        out += [{"name": name} for name in set(registry.listing()) - known]
    return sorted(out, key=lambda e: (e["name"], e.get("version", "")))
