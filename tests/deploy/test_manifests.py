"""deploy/ validates offline: every Kubernetes object against the Kubernetes JSON schemas
(kubernetes-validate's bundled, strict: unknown fields are errors), the base and each overlay
as kustomize builds them, and what has no schema (KServe, prometheus-operator, the adapter's
rule, the Dockerfile) structurally, against what the server and the other manifests say."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kustomize import (
    DEPLOY,
    KUSTOMIZATIONS,
    ROOT,
    Doc,
    build,
    canonical,
    find,
    k8s_definitions,
    load_all,
    manifest_files,
)

kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")

# kinds without a schema in kubernetes-validate (custom resources): checked structurally below
CUSTOM_KINDS = {"ClusterServingRuntime", "InferenceService", "PodMonitor"}
BUILDS = {d.relative_to(DEPLOY).as_posix(): d for d in KUSTOMIZATIONS}


def validate_k8s(doc: Doc) -> None:
    try:
        kv.validate(doc, kv.latest_version(), strict=True)
    except kv.ValidationError as e:
        raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {e}") from None


def validate_definition(value: Any, definition: str) -> None:
    """``value`` against one Kubernetes definition (e.g. io.k8s.api.core.v1.Container), strict."""
    import jsonschema
    from referencing import Registry, Resource

    defs = k8s_definitions()
    registry = Resource.from_contents(defs) @ Registry()
    schema = {"$ref": f"{defs['$id']}#/$defs/{definition}"}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(value)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_manifest_file_validates(path: Path) -> None:
    docs = load_all(path)
    assert docs, path
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            assert "/" in doc["apiVersion"] and doc["metadata"]["name"]
            continue
        if path.parent.parent.name == "overlays" and path.name.endswith("-patch.yaml"):
            continue  # a partial object: validated in the overlay's build
        validate_k8s(doc)


@pytest.mark.parametrize("name", list(BUILDS))
def test_each_kustomize_build_validates(name: str) -> None:
    directory = BUILDS[name]
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for ref in kust.get("resources", []) + [p["path"] for p in kust.get("patches", [])]:
        assert (directory / ref).exists(), f"{name}/kustomization.yaml names {ref}, which is missing"
    docs = build(directory)
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            validate_k8s(doc)
    for gen in kust.get("configMapGenerator", []):
        for entry in gen["files"]:
            assert (directory / entry.split("=")[-1]).is_file(), f"{name}: generator input {entry} is missing"
    listed = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    used = set(kust.get("resources", [])) | {p["path"] for p in kust.get("patches", [])}
    unused = {n for n in listed - used if not n.endswith(".example.yaml")}  # examples are applied by hand
    assert not unused, f"{name}: files no kustomization uses: {unused}"


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl not installed: the Python build stands alone"
)
@pytest.mark.parametrize("name", list(BUILDS))
def test_python_build_equals_kubectl_kustomize(name: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(BUILDS[name])], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        pytest.skip(f"kubectl kustomize unavailable here: {out.stderr.strip()[:200]}")
    assert canonical(build(BUILDS[name])) == canonical(list(yaml.safe_load_all(out.stdout)))


def container(docs: list[Doc]) -> Doc:
    (c,) = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(c)


def flag(args: list[str], name: str, default: str | None = None) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return args[i + 1]
    return default


@pytest.mark.parametrize("name", ["base", "overlays/s3", "overlays/gpu", "overlays/volume"])
def test_deployment_service_hpa_pdb_agree(name: str) -> None:
    docs = build(BUILDS[name])
    deployment, service = find(docs, "Deployment"), find(docs, "Service")
    hpa, pdb = find(docs, "HorizontalPodAutoscaler"), find(docs, "PodDisruptionBudget")
    pod = deployment["spec"]["template"]
    c = container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # every listener's flag and its container port agree; the Service exposes all three by name
    for role in ("http", "grpc", "metrics"):
        assert int(flag(c["args"], f"--{role}-port") or -1) == ports[role], role
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http", "grpc", "metrics"}
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # probes: readiness on ready, liveness on live, a startup probe that waits for slow loads
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    # the drain fits in the grace period: preStop sleep + --exit-timeout-secs + unload + 5 s
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    exit_timeout = float(flag(c["args"], "--exit-timeout-secs", "30") or 30)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + exit_timeout + 5 + 10, (grace, pre_stop, exit_timeout)
    # the HPA scales this Deployment on the adapter's metric
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == adapter_rule()["name"]["as"]
    assert hpa["spec"]["minReplicas"] >= pdb["spec"]["maxUnavailable"] + 1


def adapter_rule() -> dict[str, Any]:
    (cm,) = load_all(DEPLOY / "monitoring" / "prometheus-adapter-config.yaml")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    (rule,) = config["rules"]
    return dict(rule)


def adapter_metric_names() -> set[str]:
    rule = adapter_rule()
    text = rule["seriesQuery"] + " " + rule["metricsQuery"]
    return set(re.findall(r"\b(?:nv|flowserve)_[a-z_]+\b", text)) - {rule["name"]["as"]}


def test_prometheus_adapter_rule_is_well_formed() -> None:
    rule = adapter_rule()
    # prometheus-adapter's rule fields (its config schema: seriesQuery, resources, name, metricsQuery)
    assert set(rule) == {"seriesQuery", "resources", "name", "metricsQuery"}
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    assert re.fullmatch(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    assert rule["metricsQuery"].count("(") == rule["metricsQuery"].count(")")
    # queue time per request, as Triton's chart: queue duration over successful requests
    assert adapter_metric_names() == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    (monitor,) = load_all(DEPLOY / "monitoring" / "podmonitor.yaml")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    base = build(DEPLOY / "base")
    assert endpoint["port"] in {p["name"] for p in container(base)["ports"]}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= find(base, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_kserve_runtime_is_well_formed() -> None:
    (runtime,) = load_all(DEPLOY / "kserve" / "cluster-serving-runtime.yaml")
    assert (
        runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and runtime["kind"] == "ClusterServingRuntime"
    )
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert all({"name", "version"} <= set(f) for f in spec["supportedModelFormats"])
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"  # the name KServe's controller looks for
    validate_definition(c, "io.k8s.api.core.v1.Container")  # the container is a core Container
    assert flag(c["args"], "--model-repository") == "/mnt/models"  # where the storage initializer puts models
    assert flag(c["args"], "--http-port") == "8080" and flag(c["args"], "--grpc-port") == "9000"
    assert c["readinessProbe"]["httpGet"]["port"] == 8080
    assert spec["annotations"]["prometheus.kserve.io/port"] == flag(c["args"], "--metrics-port")
    (isvc,) = load_all(DEPLOY / "kserve" / "inference-service.example.yaml")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["protocolVersion"] in spec["protocolVersions"]


def test_every_manifest_flag_is_a_flowserve_serve_flag() -> None:
    from flowserve.cli import build_parser

    parser = build_parser()
    overlays = ("base", "overlays/s3", "overlays/gpu", "overlays/volume")
    commands = [container(build(BUILDS[n]))["args"] for n in overlays]
    (runtime,) = load_all(DEPLOY / "kserve" / "cluster-serving-runtime.yaml")
    commands.append(runtime["spec"]["containers"][0]["args"])
    commands.append(dockerfile_cmd())
    for args in commands:
        parser.parse_args(args)  # exits (SystemExit) on an unknown flag or a bad value


def dockerfile_text() -> str:
    return (ROOT / "Dockerfile").read_text()


def dockerfile_cmd() -> list[str]:
    import json

    text = dockerfile_text().replace("\\\n", "")
    (line,) = [x for x in text.splitlines() if x.startswith("CMD ")]
    return list(json.loads(line[4:]))


def install_script() -> str:
    return (ROOT / "docker" / "install.sh").read_text()


def variant_extras(variant: str) -> set[str]:
    """docker/install.sh's default extras for a variant."""
    text = install_script()
    block = re.search(rf"^  {variant}\)\n(.*?);;", text, re.M | re.S)
    assert block, variant
    found = re.search(r"default_extras=(\S+)", block.group(1))
    assert found, variant
    return set(found.group(1).split(","))


def test_dockerfile_installs_as_the_makefile_does_and_matches_the_manifests() -> None:
    import tomllib

    text = dockerfile_text()
    makefile = (ROOT / "Makefile").read_text()
    script = install_script()
    # the Makefile's install target: a venv, pip upgraded, an editable install of the project,
    # which docker/install.sh does per variant, and the Dockerfile runs
    assert "-m venv $(VENV)" in makefile and "pip install -q --upgrade pip" in makefile
    install = re.search(r"^install:.*\n\t\$\(BIN\)/pip install -q -e '?\.\[([\w,-]+)\]", makefile, re.M)
    assert install, "the Makefile's install target is an editable pip install of the project"
    assert 'python3 -m venv "$venv"' in script and '"$venv/bin/pip" install -q --upgrade pip' in script
    assert script.count('install -q -e ".[$extras]"') + script.count('-e ".[$extras]"') >= 2
    assert re.search(r'^RUN .*sh docker/install\.sh "\$VIRTUAL_ENV" "\$VARIANT" "\$EXTRAS"$', text, re.M)
    assert re.search(r"^COPY docker/install\.sh ", text, re.M)
    # the CPU image installs what `make install` does (the bundled models' frameworks) and remote
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(install.group(1).split(",")) | {"remote"} == variant_extras("cpu")
    # the CUDA image: the same frameworks in GPU builds (onnxruntime-gpu never beside onnxruntime)
    bundled = set(re.findall(r"flowserve\[([\w,-]+)\]", " ".join(optional["bundled"]))[0].split(","))
    cuda = variant_extras("cuda")
    assert cuda >= (bundled - {"onnx"}) | {"onnx-gpu", "remote"} and "onnx" not in cuda
    assert variant_extras("cpu") | cuda <= set(optional)
    # the variants and their base images
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M)
    assert re.search(r"^ARG CPU_BASE=python:3\.11", text, re.M)
    assert re.search(r"^ARG CUDA_BASE=nvidia/cuda:12\.\S+-cudnn-runtime-", text, re.M)
    assert re.search(r"^FROM \$\{CPU_BASE\} AS base-cpu$", text, re.M)
    assert re.search(r"^FROM \$\{CUDA_BASE\} AS base-cuda$", text, re.M)
    assert re.search(r"^FROM base-\$\{VARIANT\}$", text, re.M)
    # what the image holds and runs is what the base Deployment runs
    for path in ("pyproject.toml", "README.md", "flowserve", "model_repository", "graphs", "nodes"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", text, re.M), path
    base = container(build(DEPLOY / "base"))
    assert re.search(r'^ENTRYPOINT \["flowserve"\]', text, re.M) and base["command"] == ["flowserve"]
    assert dockerfile_cmd() == base["args"]
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, re.M)[0].split()}
    assert exposed == {p["containerPort"] for p in base["ports"]}
    user = re.search(r"^USER (\d+)", text, re.M)
    assert user is not None
    assert (
        int(user.group(1))
        == find(build(DEPLOY / "base"), "Deployment")["spec"]["template"]["spec"]["securityContext"][
            "runAsUser"
        ]
    )
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert not {
        "flowserve",
        "model_repository",
        "graphs",
        "nodes",
        "pyproject.toml",
        "README.md",
        "docker",
    } & set(ignored)


def test_the_gpu_overlay_runs_the_cuda_image() -> None:
    kust = yaml.safe_load((DEPLOY / "overlays" / "gpu" / "kustomization.yaml").read_text())
    (image,) = kust["images"]
    assert image["newTag"] == "cuda12"
    readme = (DEPLOY / "README.md").read_text()
    assert "docker build -t flowserve:cuda12 --build-arg VARIANT=cuda ." in readme


def test_the_derived_image_example_replaces_the_content_the_base_serves() -> None:
    """deploy/examples/own-image/Dockerfile puts its folders where the base image's CMD (and
    deploy/base's args) read them, nodes/ beside graphs/, as the image's user again."""
    from tests.deploy.dockerfile import instructions

    example = DEPLOY / "examples" / "own-image"
    steps = instructions((example / "Dockerfile").read_text())
    args = container(build(DEPLOY / "base"))["args"]
    repository, graphs = flag(args, "--model-repository"), flag(args, "--graphs")
    assert repository and graphs
    copies = {rest.split()[-1]: rest.split()[0] for kw, rest in steps if kw == "COPY"}
    assert copies == {
        repository: "model_repository",
        graphs: "graphs",
        str(Path(graphs).parent / "nodes"): "nodes",
    }
    removed = [rest for kw, rest in steps if kw == "RUN" and rest.startswith("rm -rf ")]
    assert removed == [f"rm -rf {repository} {graphs} {Path(graphs).parent / 'nodes'}"]
    # FROM the image deploy/base runs
    (arg,) = [rest for kw, rest in steps if kw == "ARG"]
    base_image = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["images"][0]
    assert arg == f"FLOWSERVE_IMAGE={base_image['newName']}:{base_image['newTag']}"
    assert ("FROM", "${FLOWSERVE_IMAGE}") in steps
    users = [rest for kw, rest in steps if kw == "USER"]
    assert users[-1] == re.search(r"^USER (\S+)", dockerfile_text(), re.M).group(1)  # type: ignore[union-attr]
    for folder in copies.values():
        assert (example / folder).is_dir(), folder


def test_the_volume_overlay_mounts_nodes_beside_graphs() -> None:
    docs = build(BUILDS["overlays/volume"])
    c = container(docs)
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert flag(c["args"], "--model-repository") == mounts["models"]
    assert flag(c["args"], "--graphs") == mounts["graphs"]
    assert Path(mounts["nodes"]) == Path(mounts["graphs"]).parent / "nodes"  # importable as `nodes`
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = find(docs, "PersistentVolumeClaim")["metadata"]["name"]
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == claim
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    assert {volumes[n]["configMap"]["name"] for n in ("graphs", "nodes")} == set(maps)
    # the generated ConfigMaps hold the example image's graph and node code (kept in step)
    example = DEPLOY / "examples" / "own-image"
    held = {key: value for d in maps.values() for key, value in d["data"].items()}
    assert held == {
        "affine.yaml": (example / "graphs" / "affine.yaml").read_text(),
        "__init__.py": (example / "nodes" / "__init__.py").read_text(),
        "mathops.py": (example / "nodes" / "mathops.py").read_text(),
    }
