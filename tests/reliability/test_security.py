"""Restricted APIs (Triton's --http-restricted-api / --grpc-restricted-protocol), client shared
memory off with --allow-shm=false (over both protocols), model load file overrides that cannot
write outside the model's directory, config overrides that name no file outside it, and log
and trace file locations that no network request can change."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

ADMIN = "model-repository,shared-memory,trace,logging:admin-key=s3cret"
SERVER_FLAGS = (
    f"--http-restricted-api={ADMIN}",
    f"--grpc-restricted-protocol={ADMIN}",
    "--grpc-restricted-protocol=inference:infer-key=let-me-in",
    "--allow-shm",
)
HTTP_ADMIN = {"admin-key": "s3cret"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "let-me-in"}
ROW = np.arange(16, dtype=np.int32).reshape(1, 16)
ADD_SUB = json.dumps(
    {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": ROW.reshape(-1).tolist()}
            for n in ("INPUT0", "INPUT1")
        ]
    }
).encode()


# ------------------------------------------------------------------ restricted APIs, HTTP

RESTRICTED_HTTP = [
    ("POST", "/v2/repository/index", b"{}"),
    ("POST", "/v2/repository/models/no_such_model/unload", b"{}"),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/systemsharedmemory/region/r/unregister", b""),
    ("GET", "/v2/cudasharedmemory/status", None),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/trace/setting", b'{"trace_level": ["TIMESTAMPS"]}'),
    ("GET", "/v2/models/add_sub/trace/setting", None),
    ("GET", "/v2/logging", None),
    ("POST", "/v2/logging", b'{"log_verbose_level": 1}'),
    ("POST", "/ui/api/trace-settings", b'{"trace_level": ["TIMESTAMPS"]}'),
]
OPEN_HTTP = [
    ("GET", "/v2/health/live", None),
    ("GET", "/v2/health/ready", None),
    ("GET", "/v2", None),
    ("GET", "/v2/models/add_sub", None),
    ("GET", "/v2/models/add_sub/ready", None),
    ("GET", "/v2/models/add_sub/config", None),
    ("GET", "/v2/models/stats", None),
    ("POST", "/v2/models/add_sub/infer", ADD_SUB),
]


def http_call(
    port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, Any]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw


@pytest.mark.parametrize("method,path,body", RESTRICTED_HTTP)
def test_http_restricted_endpoints_need_the_header(
    module_server: Any, method: str, path: str, body: bytes | None
) -> None:
    port = module_server.http_port
    for headers in ({}, {"admin-key": "wrong"}, {"other-key": "s3cret"}):
        status, reply = http_call(port, method, path, body, headers)
        assert status == 403, (path, headers, reply)
        assert reply == {"error": "This API is restricted, expecting header 'admin-key'"}
    status, reply = http_call(port, method, path, body, HTTP_ADMIN)
    assert status != 403, (path, reply)
    assert (
        http_call(port, method, path, body, {"Admin-Key": "s3cret"})[0] != 403
    )  # names are case-insensitive


@pytest.mark.parametrize("method,path,body", OPEN_HTTP)
def test_http_other_endpoints_stay_open(
    module_server: Any, method: str, path: str, body: bytes | None
) -> None:
    status, reply = http_call(module_server.http_port, method, path, body, {})
    assert status == 200, (path, reply)


# ------------------------------------------------------------------ restricted APIs, gRPC


@pytest.fixture(scope="module")
def client(module_server: Any) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(module_server.grpc_url)
    try:
        yield c
    finally:
        c.close()


def add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for n in ("INPUT0", "INPUT1"):
        t = grpcclient.InferInput(n, [1, 16], "INT32")
        t.set_data_from_numpy(ROW)
        inputs.append(t)
    return inputs


def refused(call: Any, header: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == str(grpc.StatusCode.UNAVAILABLE), info.value
    assert info.value.message() == f"This protocol is restricted, expecting header '{header}'"


def test_grpc_restricted_protocols(client: grpcclient.InferenceServerClient) -> None:
    admin = "triton-grpc-protocol-admin-key"
    for call in (
        lambda h: client.get_model_repository_index(headers=h),
        lambda h: client.unload_model("no_such_model", headers=h),
        lambda h: client.get_system_shared_memory_status(headers=h),
        lambda h: client.get_trace_settings(headers=h),
        lambda h: client.update_log_settings({"log_verbose_level": 0}, headers=h),
        lambda h: client.get_log_settings(headers=h),
    ):
        refused(lambda c=call: c(None), admin)  # type: ignore[misc]
        refused(lambda c=call: c({admin: "nope"}), admin)  # type: ignore[misc]
        try:
            call(GRPC_ADMIN)
        except InferenceServerException as exc:  # allowed through: any answer but the refusal
            assert "restricted" not in exc.message()
    # inference is in its own group, with its own key
    refused(lambda: client.infer("add_sub", add_sub_inputs()), "triton-grpc-protocol-infer-key")
    refused(
        lambda: client.infer("add_sub", add_sub_inputs(), headers=GRPC_ADMIN),
        "triton-grpc-protocol-infer-key",
    )
    result = client.infer("add_sub", add_sub_inputs(), headers=GRPC_INFER)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * ROW)
    # health and metadata stay open
    assert client.is_server_live() and client.is_model_ready("add_sub")
    assert client.get_model_metadata("add_sub").name == "add_sub"


def test_grpc_restricted_stream(module_server: Any) -> None:
    with grpc.insecure_channel(module_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        msg = service_pb2.ModelInferRequest(model_name="add_sub")
        for n in ("INPUT0", "INPUT1"):
            msg.inputs.add(name=n, datatype="INT32", shape=[1, 16])
            msg.raw_input_contents.append(ROW.tobytes())
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ModelStreamInfer(iter([msg]), timeout=30))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "triton-grpc-protocol-infer-key" in str(info.value.details())  # type: ignore[attr-defined]
        replies = list(stub.ModelStreamInfer(iter([msg]), timeout=30, metadata=tuple(GRPC_INFER.items())))
        assert len(replies) == 1 and not replies[0].error_message


def test_bad_restriction_flags_are_refused_at_start() -> None:
    for flag in (
        "--http-restricted-api=bogus:k=v",
        "--http-restricted-api=trace",
        "--grpc-restricted-protocol=trace:k=v",
    ):
        extra = ["--grpc-restricted-protocol=trace:k=w"] if flag.startswith("--grpc") else []
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "flowserve.cli",
                "serve",
                "--http-port=-1",
                "--grpc-port=-1",
                "--metrics-port=-1",
                flag,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, (flag, proc.stderr)
        assert "error:" in proc.stderr


# ------------------------------------------------------------------ load overrides


def load(port: int, name: str, files: dict[str, bytes]) -> tuple[int, Any]:
    config = {"name": name, "backend": "python", "max_batch_size": 0}
    params: dict[str, Any] = {"config": json.dumps(config)}
    for path, data in files.items():
        params[f"file:{path}"] = base64.b64encode(data).decode()
    body = json.dumps({"parameters": params}).encode()
    return http_call(port, "POST", f"/v2/repository/models/{name}/load", body, HTTP_ADMIN)


@pytest.mark.parametrize("path", ["../escape.py", "1/../../escape.py", "1/./../../../escape.py", ""])
def test_load_file_override_cannot_leave_the_model_directory(module_server: Any, path: str) -> None:
    status, reply = load(module_server.http_port, "override_target", {path: b"print('pwned')"})
    assert status == 400, reply
    assert "must stay inside the model directory" in reply["error"], reply


def test_a_leading_slash_in_an_override_path_stays_in_the_model_directory(module_server: Any) -> None:
    """Triton reads ``file:/1/model.py`` relative to the model directory; so does flowserve,
    and nothing is written at the absolute path."""
    target = Path(f"/tmp/flowserve-escape-{os.getpid()}.py")
    load(module_server.http_port, "override_target", {str(target): b"print('pwned')"})
    assert not target.exists()


def test_load_with_a_model_name_that_is_a_path(module_server: Any) -> None:
    with grpc.insecure_channel(module_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name in ("..", "../../tmp/x", "a/b"):
            msg = service_pb2.RepositoryModelLoadRequest(model_name=name)
            msg.parameters["config"].string_param = json.dumps({"name": "x", "backend": "python"})
            msg.parameters["file:1/model.py"].bytes_param = b"print('pwned')"
            with pytest.raises(grpc.RpcError) as info:
                stub.RepositoryModelLoad(msg, timeout=30, metadata=tuple(GRPC_ADMIN.items()))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name  # type: ignore[attr-defined]
            assert "invalid model name" in str(info.value.details())  # type: ignore[attr-defined]


# ------------------------------------------------------------------ shared memory off


def test_shared_memory_is_refused_unless_allowed(rel: Any) -> None:
    proc = rel.start("--allow-shm=false")  # on by default, as in Triton
    name = f"rel-off-{uuid.uuid4().hex[:10]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 64)
    try:
        shm.set_shared_memory_region(handle, [ROW])
        body = json.dumps({"key": f"/{name}", "offset": 0, "byte_size": 64}).encode()
        status, reply = rel.post(proc.http_port, f"/v2/systemsharedmemory/region/{name}/register", body)
        assert status == 501 and "--allow-shm" in reply["error"], reply
        status, reply = rel.get(proc.http_port, "/v2/systemsharedmemory/status")
        assert status == 501 and "--allow-shm" in reply["error"], reply
        infer = {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"shared_memory_region": name, "shared_memory_byte_size": 64},
                },
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": ROW.reshape(-1).tolist()},
            ]
        }
        status, reply = rel.post(proc.http_port, "/v2/models/add_sub/infer", json.dumps(infer).encode())
        assert status == 501 and "--allow-shm" in reply["error"], reply
        with grpcclient.InferenceServerClient(proc.grpc_url) as c:
            for call in (
                lambda: c.register_system_shared_memory(name, f"/{name}", 64),
                lambda: c.get_system_shared_memory_status(),
                lambda: c.unregister_system_shared_memory(name),
            ):
                with pytest.raises(InferenceServerException) as info:
                    call()
                assert info.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
                assert "--allow-shm" in info.value.message()
            t = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
            t.set_shared_memory(name, 64)
            other = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
            other.set_data_from_numpy(ROW)
            with pytest.raises(InferenceServerException) as info:
                c.infer("add_sub", [t, other])
            assert (
                info.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
                and "--allow-shm" in info.value.message()
            )
    finally:
        shm.destroy_shared_memory_region(handle)


# ------------------------------------------------------------------ no file locations from the network

FILE_SETTINGS = [
    ("/v2/trace/setting", {"trace_file": "{path}", "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}),
    ("/v2/models/add_sub/trace/setting", {"trace_file": "{path}", "trace_level": ["TIMESTAMPS"]}),
    ("/ui/api/trace-settings", {"trace_file": "{path}", "trace_level": ["TIMESTAMPS"]}),
    ("/v2/logging", {"log_file": "{path}", "log_info": True}),
]


@pytest.mark.parametrize(("path", "settings"), FILE_SETTINGS)
def test_http_cannot_change_file_locations(
    module_server: Any, tmp_path: Path, path: str, settings: Any
) -> None:
    target = tmp_path / "written-by-a-client"
    read_back = path.replace("/ui/api/trace-settings", "/v2/trace/setting")
    status, before = http_call(module_server.http_port, "GET", read_back, None, HTTP_ADMIN)
    assert status == 200
    body = json.dumps(settings).replace("{path}", str(target)).encode()
    status, reply = http_call(module_server.http_port, "POST", path, body, HTTP_ADMIN)
    assert status == 501, reply  # UNSUPPORTED, as Triton answers
    assert "can not be updated through network protocol" in reply["error"], reply
    # a request follows; nothing may have created the file, and no other setting changed
    status, _ = http_call(module_server.http_port, "POST", "/v2/models/add_sub/infer", ADD_SUB, {})
    assert status == 200 and not target.exists()
    status, after = http_call(module_server.http_port, "GET", read_back, None, HTTP_ADMIN)
    assert status == 200 and after == before


def test_http_file_location_in_force_may_be_sent_back(module_server: Any) -> None:
    status, current = http_call(module_server.http_port, "GET", "/v2/logging", None, HTTP_ADMIN)
    assert status == 200
    status, reply = http_call(
        module_server.http_port, "POST", "/v2/logging", json.dumps(current).encode(), HTTP_ADMIN
    )
    assert status == 200 and reply == current, reply


def test_grpc_cannot_change_file_locations(client: grpcclient.InferenceServerClient, tmp_path: Path) -> None:
    target = tmp_path / "written-by-a-client"
    headers = dict(GRPC_ADMIN)
    calls = [
        lambda: client.update_trace_settings(settings={"trace_file": str(target)}, headers=headers),
        lambda: client.update_trace_settings("add_sub", {"trace_file": str(target)}, headers=headers),
        lambda: client.update_log_settings({"log_file": str(target)}, headers=headers),
    ]
    for call in calls:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert "can not be updated through network protocol" in info.value.message()
        assert info.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert not target.exists()
    # proto3 JSON leaves out an empty string: no log file is set
    assert (
        client.get_log_settings(headers=headers, as_json=True)["settings"]["log_file"].get("stringParam", "")
        == ""
    )


def test_log_and_trace_files_come_from_the_command_line(rel: Any, tmp_path: Path) -> None:
    log_file, trace_file = tmp_path / "server.log", tmp_path / "trace.json"
    proc = rel.start(
        f"--log-file={log_file}",
        f"--trace-config=triton,file={trace_file}",
        "--trace-config=rate=1",
        "--trace-config=level=TIMESTAMPS",
    )
    status, settings = rel.get(proc.http_port, "/v2/logging")
    assert status == 200 and settings["log_file"] == str(log_file)
    status, trace = rel.get(proc.http_port, "/v2/trace/setting")
    assert status == 200 and trace["trace_file"] == str(trace_file)
    status, _ = rel.post(proc.http_port, "/v2/models/add_sub/infer", ADD_SUB)
    assert status == 200
    deadline = time.monotonic() + 10
    while not trace_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(trace_file.read_text())[0]["model_name"] == "add_sub"
    assert log_file.exists()


# ------------------------------------------------------------------ config overrides name no file outside


def load_config(
    port: int, name: str, config: dict[str, Any], files: dict[str, bytes] | None = None
) -> tuple[int, Any]:
    params: dict[str, Any] = {"config": json.dumps(config)}
    for path, data in (files or {}).items():
        params[f"file:{path}"] = base64.b64encode(data).decode()
    body = json.dumps({"parameters": params}).encode()
    return http_call(port, "POST", f"/v2/repository/models/{name}/load", body, HTTP_ADMIN)


@pytest.mark.parametrize(
    "config",
    [
        {"backend": "python", "default_model_filename": "../../../../escape.py"},
        {"backend": "python", "default_model_filename": "/tmp/escape.py"},
        {"backend": "python", "default_model_filename": "../add_sub/1/model.py"},
        {"backend": "openvino", "parameters": {"CPU_EXTENSION_PATH": {"string_value": "/tmp/evil.so"}}},
        {"backend": "python", "parameters": {"EXECUTION_ENV_PATH": {"string_value": "../../env.tar.gz"}}},
    ],
)
def test_config_override_names_no_file_outside_the_model(
    module_server: Any, tmp_path: Path, config: Any
) -> None:
    marker = tmp_path / "ran"
    escape = tmp_path / "escape.py"
    escape.write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads(json.dumps(config).replace("/tmp/escape.py", str(escape)))
    for files in (None, {"1/model.py": b"raise SystemExit('must not run')"}):
        status, reply = load_config(
            module_server.http_port,
            "add_sub" if files is None else "override_paths",
            {**config, "max_batch_size": 0},
            files,
        )
        assert status == 400, reply
        assert "inside the" in reply["error"], reply
        assert not marker.exists()
    # the model that was there keeps serving
    status, _ = http_call(module_server.http_port, "POST", "/v2/models/add_sub/infer", ADD_SUB, {})
    assert status == 200


def test_shared_memory_key_that_is_a_link_is_refused(module_server: Any, tmp_path: Path) -> None:
    """A region's key names a POSIX shared memory object: never a symbolic link out of /dev/shm
    (outputs are written into regions) and never a FIFO."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"\0" * 64)
    link = Path(f"/dev/shm/flowserve-link-{uuid.uuid4().hex[:8]}")
    fifo = Path(f"/dev/shm/flowserve-fifo-{uuid.uuid4().hex[:8]}")
    link.symlink_to(victim)
    os.mkfifo(fifo)
    try:
        for key in (link, fifo):
            body = json.dumps({"key": f"/{key.name}", "offset": 0, "byte_size": 64}).encode()
            status, reply = http_call(
                module_server.http_port,
                "POST",
                f"/v2/systemsharedmemory/region/{key.name}/register",
                body,
                HTTP_ADMIN,
            )
            assert status == 400, reply
            assert key.name in reply["error"], reply
    finally:
        link.unlink()
        fifo.unlink()
