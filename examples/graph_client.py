"""Call the bundled YAML graphs of `make serve` with tritonclient, over HTTP and gRPC.

    python examples/graph_client.py                      # localhost:8000 (HTTP), :8001 (gRPC)
    python examples/graph_client.py --http HOST:PORT --grpc HOST:PORT

`fanout` (graphs/fanout.yaml) is a batched graph: inputs a, b INT32 [16] (a batch dimension in
front), outputs total = 5a - b and sum = a + b. `repeat` (graphs/repeat.yaml) is decoupled: one
request, n responses, read from a gRPC stream. To a client a graph is a model like any other.
"""

from __future__ import annotations

import argparse
import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def call_fanout(client: Any, module: Any, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """One infer call of the fanout graph; `module` is tritonclient.http or tritonclient.grpc."""
    inputs = [module.InferInput("a", list(a.shape), "INT32"), module.InferInput("b", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    outputs = [module.InferRequestedOutput("total"), module.InferRequestedOutput("sum")]
    result = client.infer("fanout", inputs, outputs=outputs)
    return {"total": result.as_numpy("total"), "sum": result.as_numpy("sum")}


def stream_repeat(url: str, x: np.ndarray, n: int) -> list[tuple[int, np.ndarray]]:
    """The decoupled repeat graph over a gRPC stream: n responses (index, y = 10 x)."""
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    inputs = [grpcclient.InferInput("x", list(x.shape), "INT32"), grpcclient.InferInput("n", [1], "INT32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([n], dtype=np.int32))
    client.async_stream_infer("repeat", inputs)
    received = []
    for _ in range(n):
        item = responses.get(timeout=30)
        if isinstance(item, Exception):
            raise item
        received.append((int(item.as_numpy("index")[0]), item.as_numpy("y")))
    client.stop_stream()
    client.close()
    return received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--http", default="localhost:8000", help="HTTP address (default: %(default)s)")
    parser.add_argument("--grpc", default="localhost:8001", help="gRPC address (default: %(default)s)")
    args = parser.parse_args()

    a = np.arange(32, dtype=np.int32).reshape(2, 16)  # two rows: the batch dimension comes first
    b = np.ones((2, 16), dtype=np.int32)
    for protocol, module, url in [("HTTP", httpclient, args.http), ("gRPC", grpcclient, args.grpc)]:
        client = module.InferenceServerClient(url)
        result = call_fanout(client, module, a, b)
        assert (result["total"] == 5 * a - b).all() and (result["sum"] == a + b).all()
        print(f"{protocol} fanout: total[0][:4] = {result['total'][0][:4].tolist()}")
        client.close()

    for index, y in stream_repeat(args.grpc, np.array([1, 2, 3], dtype=np.int32), n=3):
        print(f"gRPC stream repeat: response {index}: y = {y.tolist()}")


if __name__ == "__main__":
    main()
