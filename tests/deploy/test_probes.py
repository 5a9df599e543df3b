"""The manifests against a real flowserve: a server started with the base Deployment's (and the
s3 overlay's) arguments answers every probe path on the port the manifest names, gRPC on its
port, /metrics on its port with every series the autoscaler rule reads, and drains within the
Deployment's grace period."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, ServerProcess, free_port, start_server
from tests.deploy.kustomize import DEPLOY, build, load_all
from tests.deploy.test_manifests import adapter_metric_names, container, flag

pytestmark = pytest.mark.slow

# flags start_server sets itself (its own free ports and local paths)
OWN = ("--host", "--http-port", "--grpc-port", "--metrics-port", "--model-repository", "--graphs")


def server_args(args: list[str]) -> list[str]:
    assert args[0] == "serve"
    return [a for a in args[1:] if not a.startswith(OWN)]


def probes(c: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(probe, path, manifest port number) of every httpGet probe of a container."""
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    out = []
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        if kind in c:
            get = c[kind]["httpGet"]
            port = get["port"]
            out.append((kind, get["path"], ports[port] if isinstance(port, str) else port))
    return out


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def check_answers(server: ServerProcess, c: dict[str, Any]) -> None:
    listener = {  # the manifest's port numbers, as its flags assign them, to this server's
        int(flag(c["args"], "--http-port") or 8000): server.http_port,
        int(flag(c["args"], "--grpc-port") or 8001): server.grpc_port,
        int(flag(c["args"], "--metrics-port") or 8002): server.metrics_port,
    }
    http = int(flag(c["args"], "--http-port") or 8000)
    for kind, path, port in probes(c):
        assert port == http, f"{kind} probes port {port}, which is not the HTTP listener"
        status, _ = get(f"http://127.0.0.1:{listener[port]}{path}")
        assert 200 <= status < 400, (kind, path, status)  # what Kubernetes counts as success
    for p in c.get("ports", []):
        assert p["containerPort"] in listener, p


def test_base_deployment_probes_ports_metrics_and_drain() -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    deployment = next(d for d in build(DEPLOY / "base") if d["kind"] == "Deployment")
    c = container([deployment])
    server = start_server(
        *server_args(c["args"]), repositories=(BUNDLED_REPOSITORY,), graphs=(BUNDLED_GRAPHS,)
    )
    try:
        check_answers(server, c)
        # the gRPC port answers gRPC (Service port "grpc"), and one inference makes the queue counters move
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_live() and client.is_server_ready()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        client.infer("simple", inputs)
        client.close()
        # every series the prometheus-adapter rule (hence the HPA) reads, with samples
        status, text = get(server.metrics_url)
        assert status == 200
        for name in adapter_metric_names():
            assert re.search(rf'^{name}\{{[^}}]*model="simple"', text, re.M), f"{name} missing from /metrics"
        notes = deployment["spec"]["template"]["metadata"]["annotations"]  # the scrape annotations
        assert notes["prometheus.io/path"] == "/metrics"
        assert int(notes["prometheus.io/port"]) == int(flag(c["args"], "--metrics-port") or 8002)
    finally:
        started = time.monotonic()
        code = server.stop(timeout=60)
        drained = time.monotonic() - started
    # an idle server drains and unloads well inside what the grace period leaves after
    # preStop and --exit-timeout-secs
    spec = deployment["spec"]["template"]["spec"]
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    exit_timeout = float(flag(c["args"], "--exit-timeout-secs", "30") or 30)
    assert code == 0, server.log()
    assert drained < spec["terminationGracePeriodSeconds"] - pre_stop - exit_timeout, drained


def test_kserve_runtime_probes_answer() -> None:
    (runtime,) = load_all(DEPLOY / "kserve" / "cluster-serving-runtime.yaml")
    c = runtime["spec"]["containers"][0]
    server = start_server(*server_args(c["args"]), repositories=(BUNDLED_REPOSITORY,), graphs=())
    try:
        check_answers(server, c)
    finally:
        assert server.stop() == 0


def test_s3_overlay_serves_from_a_bucket_with_the_secrets_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The s3 overlay's arguments and its Secret's keys, against a local S3 server (moto)."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    c = container(build(DEPLOY / "overlays" / "s3"))
    (secret,) = load_all(DEPLOY / "overlays" / "s3" / "secret.example.yaml")
    assert c["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    for key in secret["stringData"]:  # the environment the Secret gives the pod, test values
        monkeypatch.setenv(key, "us-east-1" if key == "AWS_DEFAULT_REGION" else "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    port = free_port()
    moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"})
        bucket = f"models-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        for f in (BUNDLED_REPOSITORY / "simple").rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                fs.pipe(
                    f"{bucket}/models/simple/{f.relative_to(BUNDLED_REPOSITORY / 'simple').as_posix()}",
                    f.read_bytes(),
                )
        url = flag(c["args"], "--model-repository")
        assert url is not None and url.startswith("s3://")
        local = url.replace("s3://my-bucket", f"s3://127.0.0.1:{port}/{bucket}")  # Triton's endpoint form
        cache_dir = flag(c["args"], "--repository-cache-dir")
        args = [a.replace(str(cache_dir), str(tmp_path / "cache")) for a in server_args(c["args"])]
        args.append("--repository-settle-secs=0")
        server = start_server(*args, f"--model-repository={local}", repositories=(), graphs=())
        try:
            check_answers(server, c)
            status, _ = get(f"http://{server.http_url}/v2/models/simple/ready")
            assert status == 200
            assert any((tmp_path / "cache").rglob("config.pbtxt"))  # mirrored into the cache dir
        finally:
            assert server.stop() == 0
    finally:
        moto.stop()
