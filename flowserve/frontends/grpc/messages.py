"""The data plane's plain-dict answers as protobuf messages, and settings requests as dicts."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from flowserve.core.errors import InvalidArgument
from flowserve.frontends.grpc.codec import param_value


def server_metadata(meta: dict[str, Any]) -> Any:
    return pb.ServerMetadataResponse(
        name=meta["name"], version=meta["version"], extensions=meta["extensions"]
    )


def model_metadata(meta: dict[str, Any]) -> Any:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta["name"],
        versions=meta["versions"],
        platform=meta["platform"],
        inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
        outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]],
    )


def _duration(d: dict[str, int]) -> Any:
    return pb.StatisticDuration(count=d["count"], ns=d["ns"])


def _model_stats(s: dict[str, Any]) -> Any:
    infer = s["inference_stats"]
    msg = pb.ModelStatistics(
        name=s["name"],
        version=s["version"],
        last_inference=s["last_inference"],
        inference_count=s["inference_count"],
        execution_count=s["execution_count"],
        inference_stats=pb.InferStatistics(**{k: _duration(v) for k, v in infer.items()}),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b["batch_size"],
                compute_input=_duration(b["compute_input"]),
                compute_infer=_duration(b["compute_infer"]),
                compute_output=_duration(b["compute_output"]),
            )
            for b in s["batch_stats"]
        ],
        memory_usage=[
            pb.MemoryUsage(type=m["type"], id=m["id"], byte_size=m["byte_size"]) for m in s["memory_usage"]
        ],
    )
    for key, stats in s.get("response_stats", {}).items():
        msg.response_stats[key].CopyFrom(
            pb.InferResponseStatistics(**{k: _duration(v) for k, v in stats.items()})
        )
    return msg


def statistics(stats: dict[str, Any]) -> Any:
    return pb.ModelStatisticsResponse(model_stats=[_model_stats(s) for s in stats["model_stats"]])


def repository_index(entries: list[dict[str, str]]) -> Any:
    model = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[
            model(
                name=e["name"],
                version=e.get("version", ""),
                state=e.get("state", ""),
                reason=e.get("reason", ""),
            )
            for e in entries
        ]
    )


def shm_status(regions: list[dict[str, Any]]) -> Any:
    msg = pb.SystemSharedMemoryStatusResponse()
    for r in regions:
        msg.regions[str(r["name"])].CopyFrom(
            pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r["name"], key=r["key"], offset=r["offset"], byte_size=r["byte_size"]
            )
        )
    return msg


def cuda_shm_status(regions: list[dict[str, Any]]) -> Any:
    msg = pb.CudaSharedMemoryStatusResponse()
    for r in regions:
        msg.regions[str(r["name"])].CopyFrom(
            pb.CudaSharedMemoryStatusResponse.RegionStatus(
                name=r["name"], device_id=r["device_id"], byte_size=r["byte_size"]
            )
        )
    return msg


def trace_request_settings(request: Any) -> dict[str, Any]:
    """TraceSettingRequest settings: a setting with no values means "clear" (None)."""
    out: dict[str, Any] = {}
    for key, value in request.settings.items():
        values = list(value.value)
        out[key] = values if values else None
    return out


def trace_settings(settings: dict[str, Any]) -> Any:
    msg = pb.TraceSettingResponse()
    for key, value in settings.items():
        values = [value] if isinstance(value, str) else [str(v) for v in value]
        msg.settings[key].value.extend(values)
    return msg


def log_request_settings(request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in request.settings.items():
        v = param_value(value)
        if v is None:
            raise InvalidArgument(f"log setting '{key}' has no value")
        out[key] = v
    return out


def log_settings(settings: dict[str, Any]) -> Any:
    msg = pb.LogSettingsResponse()
    for key, value in settings.items():
        entry = msg.settings[key]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.uint32_param = value
        else:
            entry.string_param = str(value)
    return msg
