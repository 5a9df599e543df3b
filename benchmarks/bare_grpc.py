"""The gRPC ceiling: a minimal grpc.aio servicer of Triton's ``inference.GRPCInferenceService``
that answers one fixed model, ``add_sub`` (FP32 [16]), with no engine behind it.

It implements what perf_analyzer calls (server and model metadata, model config, statistics,
readiness) and ``ModelInfer`` straight from ``raw_input_contents`` to ``raw_output_contents``,
on the same event loop kind flowserve uses (uvloop), and on the same transport: flowserve's
own HTTP/2 server (``--server native``, the default, as flowserve's) or grpc.aio
(``--server grpcio``). What flowserve's engine costs on top of its transport is the distance
to this servicer.

    python benchmarks/bare_grpc.py --port 8001 [--server grpcio]
"""

# ruff: noqa: N802  (rpc names are fixed by the protocol)

from __future__ import annotations

import argparse
from typing import Any

import grpc
import numpy as np
import uvloop
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

MODEL = "add_sub"
_Tensor = pb.ModelMetadataResponse.TensorMetadata
_Out = pb.ModelInferResponse.InferOutputTensor


def _config() -> Any:
    config = mc.ModelConfig(name=MODEL, backend="python", max_batch_size=64)
    for name in ("INPUT0", "INPUT1"):
        config.input.add(name=name, data_type=mc.TYPE_FP32, dims=[16])
    for name in ("OUTPUT0", "OUTPUT1"):
        config.output.add(name=name, data_type=mc.TYPE_FP32, dims=[16])
    return config


class BareServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.metadata = pb.ModelMetadataResponse(
            name=MODEL,
            versions=["1"],
            platform="python",
            inputs=[_Tensor(name=n, datatype="FP32", shape=[-1, 16]) for n in ("INPUT0", "INPUT1")],
            outputs=[_Tensor(name=n, datatype="FP32", shape=[-1, 16]) for n in ("OUTPUT0", "OUTPUT1")],
        )
        self.config = pb.ModelConfigResponse(config=_config())
        self.stats = pb.ModelStatisticsResponse(
            model_stats=[pb.ModelStatistics(name=MODEL, version="1", inference_stats=pb.InferStatistics())]
        )

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="bare", version="0")

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return self.metadata

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return self.config

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        return self.stats

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        raw = request.raw_input_contents
        shape = list(request.inputs[0].shape)
        a = np.frombuffer(raw[0], np.float32).reshape(shape)
        b = np.frombuffer(raw[1], np.float32).reshape(shape)
        return pb.ModelInferResponse(
            model_name=MODEL,
            model_version="1",
            id=request.id,
            outputs=[
                _Out(name="OUTPUT0", datatype="FP32", shape=shape),
                _Out(name="OUTPUT1", datatype="FP32", shape=shape),
            ],
            raw_output_contents=[(a + b).tobytes(), (a - b).tobytes()],
        )


async def serve(host: str, port: int, transport: str) -> None:
    if transport == "native":
        import asyncio

        from flowserve.frontends.grpc import SERVICE
        from flowserve.frontends.grpc.http2 import Http2GrpcServer, service_methods

        native = Http2GrpcServer(service_methods(BareServicer(), SERVICE, pb), 2**31 - 1)
        await native.start(host, port)
        await asyncio.Event().wait()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(BareServicer(), server)
    if not server.add_insecure_port(f"{host}:{port}"):
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--server", choices=("native", "grpcio"), default="native")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.server))


if __name__ == "__main__":
    main()
