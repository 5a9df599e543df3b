"""The HTTP ceiling: a minimal raw-ASGI handler that answers one fixed model, ``add_sub``
(FP32 [16], OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1), with no engine behind it: no
routing table, no validation, no batching, no statistics. It is served by flowserve's own
HTTP/1.1 server (``--server native``, the default, as flowserve's) or by uvicorn with
httptools (``--server uvicorn``), on uvloop either way.

It answers just what perf_analyzer asks for (server and model metadata, model config, statistics,
readiness) and ``POST /v2/models/add_sub/infer`` with binary or JSON tensors. What flowserve's HTTP
front end costs on top of the protocol stack is the distance to this handler.

    python benchmarks/bare_http.py --port 8000 [--server uvicorn]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import rapidjson
import uvicorn
import uvloop

from flowserve.frontends import listen_socket
from flowserve.frontends.http.http1 import Http1Server

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MODEL = "add_sub"
DIMS = [-1, 16]
METADATA = rapidjson.dumps(
    {
        "name": MODEL,
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": n, "datatype": "FP32", "shape": DIMS} for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": n, "datatype": "FP32", "shape": DIMS} for n in ("OUTPUT0", "OUTPUT1")],
    }
).encode()
CONFIG = rapidjson.dumps(
    {
        "name": MODEL,
        "platform": "",
        "backend": "python",
        "max_batch_size": 64,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
    }
).encode()
SERVER = rapidjson.dumps({"name": "bare", "version": "0", "extensions": ["binary_tensor_data"]}).encode()
_ZERO = {"count": 0, "ns": 0}
STATS = rapidjson.dumps(
    {
        "model_stats": [
            {
                "name": MODEL,
                "version": "1",
                "last_inference": 0,
                "inference_count": 0,
                "execution_count": 0,
                "inference_stats": {
                    k: _ZERO
                    for k in (
                        "success",
                        "fail",
                        "queue",
                        "compute_input",
                        "compute_infer",
                        "compute_output",
                        "cache_hit",
                        "cache_miss",
                    )
                },
                "batch_stats": [],
            }
        ]
    }
).encode()
_JSON = [(b"content-type", b"application/json")]


def infer(body: bytes, header_length: int | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """add_sub on one request body; returns the response body and its headers."""
    header = rapidjson.loads(body[:header_length] if header_length is not None else body)
    arrays: list[np.ndarray] = []
    offset = header_length or 0
    for item in header["inputs"]:
        shape = item["shape"]
        params = item.get("parameters")
        if params and "binary_data_size" in params:
            size = params["binary_data_size"]
            arrays.append(np.frombuffer(body, np.float32, size // 4, offset).reshape(shape))
            offset += size
        else:
            arrays.append(np.asarray(item["data"], np.float32).reshape(shape))
    a, b = arrays
    out0 = (a + b).tobytes()
    out1 = (a - b).tobytes()
    shape = list(a.shape)
    response = rapidjson.dumps(
        {
            "model_name": MODEL,
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "FP32",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(out0)},
                },
                {
                    "name": "OUTPUT1",
                    "datatype": "FP32",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(out1)},
                },
            ],
        }
    ).encode()
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(len(response)).encode()),
    ]
    return response + out0 + out1, headers


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    path: str = scope["path"]
    status, body, headers = 200, b"", _JSON
    if path == f"/v2/models/{MODEL}/infer":
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        length = None
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                length = int(value)
        body, headers = infer(b"".join(chunks), length)
    elif path in (f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/versions/1"):
        body = METADATA
    elif path.endswith("/config"):
        body = CONFIG
    elif path.endswith("/stats"):
        body = STATS
    elif path == "/v2":
        body = SERVER
    elif path.startswith("/v2/health") or path.endswith("/ready") or "sharedmemory" in path:
        body = b""
    else:
        status, body = 404, b'{"error":"not found"}'
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--server", choices=("native", "uvicorn"), default="native")
    args = parser.parse_args()
    if args.server == "native":
        uvloop.run(serve_native(args.host, args.port))
        return
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        http="httptools",
        loop="uvloop",
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        timeout_keep_alive=75,
    )
    server = uvicorn.Server(config)
    server.run()


async def serve_native(host: str, port: int) -> None:
    await Http1Server(app).start(listen_socket(host, port, "HTTP"))
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
