"""The manifests against a real flowserve: a server started with the base Deployment's (and the
s3 and volume overlays') arguments answers every probe path on the port the manifest names, gRPC
on its port, /metrics on its port with every series the autoscaler rule reads, and drains within
the Deployment's grace period; during a long load the startup and liveness probes pass and the
readiness probe fails, until the load ends."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, ROOT, ServerProcess, free_port, start_server
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


def status_of(url: str) -> int:
    """The HTTP status (an error status too); raises OSError when nothing answers."""
    try:
        return get(url)[0]
    except urllib.error.HTTPError as exc:
        return exc.code


EXAMPLE = DEPLOY / "examples" / "own-image"
LISTENERS = ("--host", "--http-port", "--grpc-port", "--metrics-port")


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
        # the example's content, laid out as the overlay's URLs say: models/, graphs/, nodes/
        repo, graphs = flag(c["args"], "--model-repository"), flag(c["args"], "--graphs")
        assert repo is not None and repo.startswith("s3://my-bucket/")
        assert graphs is not None and graphs.startswith("s3://my-bucket/")
        nodes = graphs.rsplit("/", 1)[0] + "/nodes"
        for folder, url in (("model_repository", repo), ("graphs", graphs), ("nodes", nodes)):
            for f in (EXAMPLE / folder).rglob("*"):
                if f.is_file() and "__pycache__" not in f.parts:
                    key = (
                        url.replace("s3://my-bucket", bucket)
                        + "/"
                        + f.relative_to(EXAMPLE / folder).as_posix()
                    )
                    fs.pipe(key, f.read_bytes())
        endpoint = f"s3://127.0.0.1:{port}/{bucket}"  # Triton's form for an S3-compatible endpoint
        cache_dir = flag(c["args"], "--repository-cache-dir")
        args = [a.replace(str(cache_dir), str(tmp_path / "cache")) for a in server_args(c["args"])]
        args.append("--repository-settle-secs=0")
        args += [f"--model-repository={repo.replace('s3://my-bucket', endpoint)}"]
        args += [f"--graphs={graphs.replace('s3://my-bucket', endpoint)}"]
        server = start_server(*args, repositories=(), graphs=())
        try:
            check_answers(server, c)
            for model in ("add_one", "affine"):  # the graph imports nodes.mathops from the bucket
                status, _ = get(f"http://{server.http_url}/v2/models/{model}/ready")
                assert status == 200, model
            assert any((tmp_path / "cache").rglob("config.pbtxt"))  # mirrored into the cache dir
            assert any((tmp_path / "cache").rglob("nodes/mathops.py"))
        finally:
            assert server.stop() == 0
    finally:
        moto.stop()


def test_volume_overlay_serves_the_claim_and_the_config_maps(tmp_path: Path) -> None:
    """The volume overlay's mounts as folders here: the claim holds the example's models, the
    generated ConfigMaps' keys become files in their mount paths (as the kubelet writes them)."""
    docs = build(DEPLOY / "overlays" / "volume")
    c = container(docs)
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in c["volumeMounts"]:
        here = tmp_path / mount["mountPath"].lstrip("/")
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            here.mkdir(parents=True)
            for key, text in maps[volume["configMap"]["name"]].items():
                (here / key).write_text(text)
        elif "persistentVolumeClaim" in volume:
            shutil.copytree(EXAMPLE / "model_repository", here)
    args = [a.replace("=/srv/", f"={tmp_path}/srv/") for a in c["args"][1:] if not a.startswith(LISTENERS)]
    server = start_server(*args, repositories=(), graphs=())
    try:
        check_answers(server, c)
        for model in ("add_one", "affine"):  # affine imports nodes.mathops from the nodes ConfigMap
            assert status_of(f"http://{server.http_url}/v2/models/{model}/ready") == 200, model
    finally:
        assert server.stop() == 0


GATE_CONFIG = """
name: "gate"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

GATE_MODEL = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # a long load (weights being read): it ends when the test creates the gate file
        while not os.path.exists(os.environ["FLOWSERVE_TEST_GATE"]):
            time.sleep(0.05)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
            for r in requests
        ]
"""


def test_probes_during_a_long_load(tmp_path: Path) -> None:
    """While a model loads, the startup and liveness probes' path answers 2xx (the kubelet
    neither restarts the container nor waits on the startup budget) and the readiness path does
    not (no traffic yet); once it has loaded, readiness passes."""
    c = container(build(DEPLOY / "base"))
    paths = {kind: path for kind, path, _ in probes(c)}
    assert paths["startupProbe"] == paths["livenessProbe"] == "/v2/health/live"
    assert paths["readinessProbe"] == "/v2/health/ready"
    repo = tmp_path / "models"
    (repo / "gate" / "1").mkdir(parents=True)
    (repo / "gate" / "config.pbtxt").write_text(GATE_CONFIG)
    (repo / "gate" / "1" / "model.py").write_text(GATE_MODEL)
    gate = tmp_path / "gate-open"
    port = free_port()
    argv = [sys.executable, "-m", "flowserve.cli", *c["args"]]
    argv = [a for a in argv if not a.startswith((*LISTENERS, "--model-repository", "--graphs"))]
    argv += [f"--model-repository={repo}", "--host=127.0.0.1", f"--http-port={port}"]
    argv += [f"--grpc-port={free_port()}", f"--metrics-port={free_port()}"]
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "FLOWSERVE_TEST_GATE": str(gate)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the listener comes up while the model is loading
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"/v2/health/live never answered:\n{log.read_text()}"
            try:
                live = status_of(url + paths["livenessProbe"])
                break
            except OSError:
                time.sleep(0.2)
        assert live == 200, log.read_text()
        for _ in range(3):  # still loading: live, not ready, as often as asked
            assert status_of(url + paths["startupProbe"]) == 200
            assert status_of(url + paths["readinessProbe"]) == 400
        assert not gate.exists() and "loaded model 'gate'" not in log.read_text()
        gate.touch()  # the load ends
        deadline = time.monotonic() + 60
        while status_of(url + paths["readinessProbe"]) != 200:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert status_of(url + paths["livenessProbe"]) == 200
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0, log.read_text()
