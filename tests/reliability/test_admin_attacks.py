"""Three attacks from an outside run against ``flowserve serve`` (default flags and
``--workers 2``), each with a good client answered promptly meanwhile:

- absurd numbers in a load request's config override (instance_group count 100,000 or 2^31-1:
  ~21k threads and a load that never finished; max_queue_delay 2^63: a model that never
  answered): refused at once over HTTP and gRPC, naming the model, the field and the bound
  (flowserve/spec/bounds.py), and the loaded model serves on as it was;
- absurd trace and log settings (trace_rate -1 or 1e23, log_verbose_level 2^63, a trace_level
  of 100k entries): 400 / INVALID_ARGUMENT in Triton's words, naming the setting;
- sequence STARTs never ended, from one client, filling every slot of a stateful model and
  queuing many more (1,024 of them locked new sequences out for ~21 minutes): another client's
  new sequence starts once the idle time (Triton's default, 1 s) has passed, and the attacker's
  excess starts are refused at once.

The server runs in a subprocess and is always stopped.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from flowserve.nodes.sequence import MAX_WAITING_STARTS_PER_CLIENT
from flowserve.spec.triton import parse_config_text
from tests.conftest import ServerProcess, start_server
from tests.pacing import prompt_bound

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROW = np.arange(16, dtype=np.int32).reshape(1, 16)
ATTACKER, OTHER = "127.0.0.1", "127.0.0.2"  # two clients (Linux routes all of 127/8 to lo)
IDLE_S = 1.0  # max_sequence_idle_microseconds unset: Triton's default
SLOTS = 4  # the stateful model below: one instance, max_batch_size 4


@pytest.fixture(scope="module", params=["default", "workers"])
def served(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    workers = ("--workers", "2") if request.param == "workers" else ()
    server = start_server(
        *workers, "--model-control-mode=explicit", "--load-model=simple", "--load-model=sequence_accumulate",
        timeout=180.0,
    )  # fmt: skip
    try:
        yield server
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]


def call(
    served: ServerProcess,
    method: str,
    path: str,
    body: Any = None,
    source: str = ATTACKER,
    timeout: float = 60,
) -> tuple[int, dict[str, Any]]:
    """One HTTP request on a fresh connection from ``source``; (status, JSON body)."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", served.http_port, timeout=timeout, source_address=(source, 0)
    )
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode())
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    return response.status, json.loads(raw) if raw else {}


def simple_body() -> dict[str, Any]:
    data = ROW.reshape(-1).tolist()
    return {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": data} for n in ("INPUT0", "INPUT1")
        ]
    }


class Prober:
    """A good client inferring ``simple`` over and over (HTTP, fresh connections, so with
    --workers 2 both workers) while an attack runs; ``slowest`` is the slowest answer."""

    def __init__(self, served: ServerProcess) -> None:
        self.served = served
        self.slowest = 0.0
        self.answers = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.answers == 0 and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.answers and not self.errors, self.errors
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            started = time.monotonic()
            try:
                status, body = call(self.served, "POST", "/v2/models/simple/infer", simple_body(), OTHER)
            except OSError as exc:
                self.errors.append(repr(exc))
                return
            if status != 200:
                self.errors.append(f"{status} {body}")
                return
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.answers += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self.errors, self.errors
        print(f"good client: {self.answers} answers, slowest {self.slowest * 1000:.0f} ms")
        assert self.answers > 2 and self.slowest < prompt_bound(), (self.answers, self.slowest)


# ----------------------------------------------------------------------- item 8: config overrides


def simple_config(**changes: Any) -> str:
    config = parse_config_text((ROOT / "model_repository" / "simple" / "config.pbtxt").read_text())
    doc = json_format.MessageToDict(config, preserving_proto_field_name=True)
    doc.update(changes)
    return json.dumps(doc)


ABSURD = [
    (
        {"instance_group": [{"count": 100_000, "kind": "KIND_CPU"}]},
        "instance_group[0].count",
        "between 1 and 1024",
    ),
    (
        {"instance_group": [{"count": 2**31 - 1, "kind": "KIND_CPU"}]},
        "instance_group[0].count",
        "between 1 and 1024",
    ),
    (
        {"dynamic_batching": {"max_queue_delay_microseconds": str(2**63)}},
        "dynamic_batching.max_queue_delay_microseconds",
        "between 0 and 3600000000 (microseconds, 1 hour)",
    ),
]


def test_absurd_config_overrides_are_refused_at_once(served: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        with Prober(served):
            for _ in range(5):
                for changes, field, bound in ABSURD:
                    started = time.monotonic()
                    status, body = call(
                        served, "POST", "/v2/repository/models/simple/load",
                        {"parameters": {"config": simple_config(**changes)}},
                    )  # fmt: skip
                    assert time.monotonic() - started < 5.0
                    assert status == 400, body
                    assert f"field '{field}'" in body["error"] and "model 'simple'" in body["error"], body
                    assert bound in body["error"], body
                    with pytest.raises(InferenceServerException) as info:
                        grpc.load_model("simple", config=simple_config(**changes))
                    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
                    assert field in info.value.message() and bound in info.value.message()
        config = grpc.get_model_config("simple", as_json=True)["config"]
        assert [g["count"] for g in config.get("instance_group", [])] in ([], [1])  # as loaded
        assert grpc.is_model_ready("simple")
    finally:
        grpc.close()


# ----------------------------------------------------------------------- item 10: trace and log


def test_absurd_trace_and_log_settings_are_refused(served: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    cases = [
        (
            {"trace_rate": "-1"},
            "Unable to parse 'trace_rate', value is out of range [ 0, 2147483647 ], got: -1",
        ),
        ({"trace_rate": 1e23}, "Unable to parse 'trace_rate', got: 1e+23"),
        ({"trace_count": str(2**31)}, "Unable to parse 'trace_count', value is out of range"),
        ({"trace_level": ["TIMESTAMPS"] * 100_000}, "trace_level has 100000 entries, more than 8"),
    ]
    try:
        with Prober(served):
            for _ in range(3):
                for path in ("/v2/trace/setting", "/v2/models/simple/trace/setting"):
                    for settings, says in cases:
                        status, body = call(served, "POST", path, settings)
                        assert status == 400 and says in body["error"], (path, body)
                status, body = call(served, "POST", "/v2/logging", {"log_verbose_level": 2**63})
                assert (
                    status == 400
                    and "'log_verbose_level' must be an integer between 0 and 255" in body["error"]
                )
                for settings, says in [
                    ({"trace_rate": "-1"}, "value is out of range [ 0, 2147483647 ]"),
                    ({"trace_rate": "1e23"}, "Unable to parse 'trace_rate', got: 1e23"),
                    ({"trace_level": ["TENSORS"] * 100_000}, "trace_level has 100000 entries"),
                ]:
                    with pytest.raises(InferenceServerException) as info:
                        grpc.update_trace_settings(model_name="simple", settings=settings)
                    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
                    assert says in info.value.message()
                with pytest.raises(InferenceServerException) as info:
                    grpc.update_log_settings({"log_verbose_level": 2**32 - 1})  # a uint32 on the wire
                assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
                assert "log_verbose_level" in info.value.message()
        assert grpc.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
        assert grpc.get_log_settings(as_json=True)["settings"]["log_verbose_level"]["uint32_param"] == 0
    finally:
        grpc.close()


# ----------------------------------------------------------------------- item 9: sequence slots


def sequence_config() -> str:
    """sequence_accumulate with one instance of 4 slots and no max_sequence_idle_microseconds
    (so Triton's default, 1 s)."""
    path = ROOT / "tests" / "models" / "sequence_accumulate" / "config.pbtxt"
    config = parse_config_text(path.read_text())
    config.max_batch_size = SLOTS
    config.instance_group[0].count = 1
    config.sequence_batching.ClearField("max_sequence_idle_microseconds")
    return json_format.MessageToJson(config)


def start(served: ServerProcess, corr: int, source: str = ATTACKER) -> tuple[int, dict[str, Any]]:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [corr % 100]}],
        "parameters": {"sequence_id": corr, "sequence_start": True},
    }
    return call(served, "POST", "/v2/models/sequence_accumulate/infer", body, source)


def test_never_ended_sequences_do_not_lock_out_another_client(served: ServerProcess) -> None:
    status, body = call(
        served,
        "POST",
        "/v2/repository/models/sequence_accumulate/load",
        {"parameters": {"config": sequence_config()}},
    )
    assert status == 200, body
    flood = MAX_WAITING_STARTS_PER_CLIENT + 16
    with Prober(served), ThreadPoolExecutor(flood) as pool:
        for corr in range(1, SLOTS + 1):  # every slot, never ended
            assert start(served, corr)[0] == 200
        # many more STARTs: at most MAX_WAITING_STARTS_PER_CLIENT wait for a slot, the rest are
        # refused at once (over HTTP and gRPC alike: it is one client)
        backlog = [pool.submit(start, served, 1000 + i) for i in range(flood)]
        deadline = time.monotonic() + 30
        while (
            sum(f.done() for f in backlog) < flood - MAX_WAITING_STARTS_PER_CLIENT
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        refused = [f.result() for f in backlog if f.done()]
        assert len(refused) >= flood - MAX_WAITING_STARTS_PER_CLIENT, len(refused)
        assert all(s == 503 and f"client {ATTACKER}" in b["error"] for s, b in refused if s != 200), refused
        grpc = grpcclient.InferenceServerClient(served.grpc_url)
        try:
            one = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            one.set_data_from_numpy(np.ones((1, 1), np.int32))
            with pytest.raises(InferenceServerException) as info:
                grpc.infer("sequence_accumulate", [one], sequence_id=9999, sequence_start=True)
            assert (
                info.value.status() == "StatusCode.UNAVAILABLE"
                and f"client {ATTACKER}" in info.value.message()
            )
        finally:
            grpc.close()
        # another client's sequence starts within the idle time and a margin (before: behind
        # the whole backlog, one slot per idle time)
        asked = time.monotonic()
        status, body = start(served, 7777, OTHER)
        answered = time.monotonic()
        assert status == 200 and body["outputs"][0]["data"] == [77], body
        print(f"another client's START answered in {(answered - asked) * 1000:.0f} ms")
        assert answered - asked < IDLE_S + 2.0, answered - asked
