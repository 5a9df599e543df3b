"""gRPC load over one channel (as perf_analyzer uses one connection): every ModelInferRequest is
serialized once before the load starts and sent as bytes; responses come back as bytes and are
parsed only when the call fails, so protobuf costs nothing per request."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from flowserve.bench.http import RequestFailed
from flowserve.bench.inputs import Sample
from flowserve.bench.model import ModelInfo, model_info
from flowserve.core.datatypes import from_numpy
from flowserve.core.wire import to_raw

INFER = "/inference.GRPCInferenceService/ModelInfer"
_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def fetch_model(url: str, model: str, version: str = "") -> ModelInfo:
    """Metadata and config through tritonclient's gRPC client (JSON as the HTTP API gives it)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        metadata = client.get_model_metadata(model, version, as_json=True)
        config = client.get_model_config(model, version, as_json=True).get("config", {})
    except InferenceServerException as exc:
        raise RequestFailed(f"gRPC {url}: {exc.message()}") from None
    finally:
        client.close()
    return model_info(model, dict(metadata), dict(config))


def encode_request(model: ModelInfo, sample: Sample, version: str = "") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model.name, model_version=version)
    for name, array in sample.items():
        tensor = request.inputs.add(name=name, datatype=from_numpy(array.dtype))
        tensor.shape.extend(int(d) for d in np.shape(array))
        request.raw_input_contents.append(bytes(to_raw(array)))
    for name in model.outputs:
        request.outputs.add(name=name)
    return bytes(request.SerializeToString())


class GrpcSession:
    def __init__(self, call: Any, payloads: list[bytes]) -> None:
        self.call = call
        self.payloads = payloads

    async def send(self, index: int) -> None:
        try:
            await self.call(self.payloads[index])
        except grpc.aio.AioRpcError as exc:
            raise RequestFailed(f"gRPC {exc.code().name}: {exc.details()}") from None

    def close(self) -> None:
        pass


class GrpcClient:
    """One channel to ``url``; every session shares it."""

    def __init__(self, url: str, model: ModelInfo, samples: list[Sample], version: str = "") -> None:
        self.url = url
        self.payloads = [encode_request(model, s, version) for s in samples]
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None

    async def session(self) -> GrpcSession:
        if self.channel is None:
            self.channel = grpc.aio.insecure_channel(self.url, options=_OPTIONS)
            self.call = self.channel.unary_unary(INFER)
        return GrpcSession(self.call, self.payloads)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None


__all__ = ["INFER", "GrpcClient", "GrpcSession", "encode_request", "fetch_model"]
