"""Model warmup (Triton's model_warmup; ``warmup:`` in YAML graphs): samples run through every
instance before the model is READY, are not counted as inferences, and a failing sample keeps
the model unready with a reason that names it. Also the loading helpers (waves, parallel
instance creation)."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flowserve.core.node import TensorMap
from flowserve.dataplane.engine import Engine
from flowserve.nodes.backends import BACKENDS, autocompletions
from flowserve.nodes.backends.base import BackendNode
from flowserve.nodes.instances import InstancePool
from flowserve.nodes.loading import load_waves
from flowserve.nodes.warmup import sample_tensors
from flowserve.repository.settings import RepositorySettings
from flowserve.spec.repository import scan_model
from flowserve.spec.schema import WarmupInput, WarmupSpec

TEST_MODELS = Path(__file__).resolve().parents[1] / "models"

# every warmup or request execution the probe saw: (model, instance, model READY?, inputs)
SEEN: list[tuple[str, int, bool, TensorMap]] = []
UNLOADED: list[tuple[str, int]] = []


class ProbeBackend(BackendNode):
    """Echoes its first input as OUT; records whether the model was READY when it ran; raises
    when an input holds the value of parameter ``fail``."""

    def load_instance(self, index: int) -> int:
        return index

    def execute(self, instance: int, inputs: TensorMap) -> TensorMap:
        SEEN.append((self.name, instance, self.registry is not None and self.registry.has(self.name), inputs))
        fail = self.model.parameters.get("fail")
        if fail is not None and any(
            v.dtype.kind == "f" and np.any(v == float(fail)) for v in inputs.values()
        ):
            raise ValueError(f"boom: an input holds {fail}")
        return {"OUT": next(iter(inputs.values()))}

    def unload_instance(self, instance: int) -> None:
        UNLOADED.append((self.name, instance))


@pytest.fixture(autouse=True)
def probe_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    module = ModuleType("flowserve_test_warmup_probe")
    module.ProbeBackend = ProbeBackend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(BACKENDS, "warmup_probe", f"{module.__name__}:ProbeBackend")
    SEEN.clear()
    UNLOADED.clear()


def write_model(repo: Path, name: str, config: str, files: dict[str, bytes] | None = None) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config)
    for rel, data in (files or {}).items():
        (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / rel).write_bytes(data)
    return model_dir


def reason(engine: Engine, name: str) -> str:
    return "; ".join(s.reason for s in engine.registry.index() if s.name == name)


PROBE = """backend: "warmup_probe"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def entry(
    name: str,
    data: str,
    batch_size: int = 1,
    count: int = 0,
    dims: str = "3",
    dtype: str = "TYPE_FP32",
    input_name: str = "IN",
) -> str:
    """One ModelWarmup sample in config.pbtxt syntax."""
    return (
        f'{{ name: "{name}" batch_size: {batch_size} count: {count} inputs {{ key: "{input_name}" '
        f"value: {{ data_type: {dtype} dims: [ {dims} ] {data} }} }} }}"
    )


def sample(*args: Any, **kwargs: Any) -> str:
    """A model_warmup block with one sample."""
    return f"model_warmup [ {entry(*args, **kwargs)} ]\n"


async def test_warmup_runs_on_every_instance_before_ready(tmp_path: Path) -> None:
    config = (
        PROBE
        + sample("zeros", "zero_data: true", batch_size=2, count=3)
        + sample("noise", "random_data: true")
    )
    write_model(tmp_path, "probe", config)
    engine = await Engine.start([tmp_path])
    try:
        warm = list(SEEN)
        node = engine.registry.get("probe").executor.nodes[0]
        node = getattr(node, "inner", node)
        stats = engine.registry.get("probe").stats
        assert engine.model_ready("probe")
        assert node.warmup_runs == 8  # (3 + 1) runs x 2 instances
        assert (stats.inference_count, stats.execution_count) == (0, 0)  # warmup is not inference
        out = await engine.infer("probe", {"IN": np.ones((1, 3), np.float32)})
    finally:
        await engine.stop()
    assert len(warm) == 8 and not any(ready for _, _, ready, _ in warm)  # all before READY
    assert sorted({i for _, i, _, _ in warm}) == [0, 1]
    zeros = [x["IN"] for _, _, _, x in warm[:6]]
    assert all(z.shape == (2, 3) and z.dtype == np.float32 and not z.any() for z in zeros)
    noise = [x["IN"] for _, _, _, x in warm[6:]]
    assert noise[0].shape == (1, 3) and np.all((noise[0] >= 0) & (noise[0] < 1)) and noise[0].any()
    np.testing.assert_array_equal(noise[0], noise[1])  # seeded by the sample name: reproducible
    assert SEEN[-1][2] is True and out["OUT"].shape == (1, 3)


async def test_input_data_files(tmp_path: Path) -> None:
    values = np.array([1.5, -2.0, 3.25], np.float32)
    words = [b"hi", b"w\xc3\xb6rld"]
    raw_words = b"".join(struct.pack("<I", len(w)) + w for w in words)
    write_model(
        tmp_path,
        "floats",
        PROBE + sample("file", 'input_data_file: "in.bin"', batch_size=2),
        {"warmup/in.bin": values.tobytes()},
    )
    text = (
        PROBE.replace("TYPE_FP32", "TYPE_STRING")
        .replace("max_batch_size: 4", "max_batch_size: 0")
        .replace("[ 3 ]", "[ 2 ]")
    )
    write_model(
        tmp_path,
        "text",
        text + sample("words", 'input_data_file: "words.bin"', dims="2", dtype="TYPE_STRING"),
        {"warmup/words.bin": raw_words},
    )
    async with _engine(tmp_path) as engine:
        assert engine.model_ready("floats") and engine.model_ready("text")
    floats = [x["IN"] for name, _, _, x in SEEN if name == "floats"]
    texts = [x["IN"] for name, _, _, x in SEEN if name == "text"]
    np.testing.assert_array_equal(floats[0], np.stack([values, values]))
    assert list(texts[0]) == words and texts[0].shape == (2,)


async def test_failing_warmup_keeps_the_model_unready_with_the_reason(tmp_path: Path) -> None:
    fives = np.full(3, 5.0, np.float32).tobytes()
    config = PROBE + 'parameters { key: "fail" value { string_value: "5" } }\n'
    fine, bad = entry("fine", "zero_data: true"), entry("fives", 'input_data_file: "fives.bin"')
    config += f"model_warmup [ {fine}, {bad} ]\n"
    write_model(tmp_path, "refuses", config, {"warmup/fives.bin": fives})
    write_model(tmp_path, "fine", PROBE + sample("zeros", "zero_data: true"))
    async with _engine(tmp_path) as engine:
        assert not engine.model_ready("refuses") and engine.model_ready("fine")
        text = reason(engine, "refuses")
        assert "warmup sample 'fives' failed on instance 0" in text and "boom: an input holds 5" in text
        with pytest.raises(Exception, match="is not ready"):
            await engine.infer("refuses", {"IN": np.ones((1, 3), np.float32)})
    assert sorted(i for name, i in UNLOADED if name == "refuses") == [0, 1]  # its instances were released


async def test_decoupled_models_warm_up_through_their_stream(tmp_path: Path) -> None:
    source = TEST_MODELS / "decoupled_repeat"
    model_dir = tmp_path / "decoupled_repeat"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_bytes((source / "1" / "model.py").read_bytes())
    config = (source / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(
        config + sample("three", "random_data: true", count=2, dtype="TYPE_INT32")
    )
    async with _engine(tmp_path) as engine:
        assert engine.model_ready("decoupled_repeat")
        node = engine.registry.get("decoupled_repeat").executor.nodes[0]
        assert getattr(node, "inner", node).warmup_runs == 2


def test_invalid_samples_are_reported_when_scanning(tmp_path: Path) -> None:
    cases = {
        "unknown_input": sample("s1", "zero_data: true", input_name="NOPE"),
        "wrong_type": sample("s2", "zero_data: true", dtype="TYPE_INT32"),
        "too_big": sample("s3", "zero_data: true", batch_size=9),
        "no_file": sample("s4", 'input_data_file: "missing.bin"'),
        "no_data": sample("s5", ""),
        "bad_dims": sample("s6", "zero_data: true", dims="4"),
    }
    expected = {
        "unknown_input": "'NOPE' is not an input",
        "wrong_type": "is FP32, not INT32",
        "too_big": "exceeds max_batch_size 4",
        "no_file": "does not exist",
        "no_data": "sets none of zero_data",
        "bad_dims": "do not fit the input's dims",
    }
    for name, text in cases.items():
        model_dir = write_model(tmp_path, name, PROBE + text)
        scan = scan_model(model_dir, autocompletions())
        issues = "; ".join(str(i) for i in scan.issues)
        assert name in scan.failed, name
        assert expected[name] in issues and "model_warmup[0]" in issues, issues
        assert "sample 's" in issues or "'s5'" in issues


def test_ensembles_cannot_warm_up(tmp_path: Path) -> None:
    config = (
        'platform: "ensemble"\nmax_batch_size: 4\ninput [ { name: "IN" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "probe" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }\n'
    ) + sample("s", "zero_data: true")
    scan = scan_model(write_model(tmp_path, "ens", config), autocompletions())
    assert "an ensemble cannot have model_warmup" in "; ".join(str(i) for i in scan.issues)


async def test_config_yaml_warmup(tmp_path: Path) -> None:
    model_dir = tmp_path / "yaml_probe"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.yaml").write_text(
        """backend: warmup_probe
max_batch_size: 4
input: [{name: IN, data_type: TYPE_FP32, dims: [3]}]
output: [{name: OUT, data_type: TYPE_FP32, dims: [3]}]
model_warmup:
  - name: ones_from_yaml
    batch_size: 3
    count: 2
    inputs: {IN: {data_type: TYPE_FP32, dims: [3], random_data: true}}
"""
    )
    async with _engine(tmp_path) as engine:
        assert engine.model_ready("yaml_probe")
    assert [x["IN"].shape for _, _, _, x in SEEN] == [(3, 3), (3, 3)]


GRAPH = """name: {name}
max_batch_size: 4
inputs:
  x: {{datatype: FP32, dims: [2]}}
outputs:
  y: echo.y
nodes:
  echo:
    python: {module}:Echo
    inputs: {{x: $x}}
    outputs: {{y: {{datatype: FP32, dims: [-1, 2]}}}}
warmup:
  - name: {sample}
    batch_size: 2
    count: 3
    inputs:
      x: {{datatype: FP32, dims: [2], {data}}}
"""
ECHO = """
import numpy as np
CALLS = []

class Echo:
    def execute(self, inputs):
        CALLS.append(inputs["x"].copy())
        if np.any(inputs["x"] == 9):
            raise ValueError("nines are refused")
        return {"y": inputs["x"]}
"""


async def test_yaml_graph_warmup(tmp_path: Path) -> None:
    module = f"warm_echo_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(ECHO)
    graphs = tmp_path / "graphs"
    (graphs / "warmup").mkdir(parents=True)  # input_data_file: next to the graph file
    (graphs / "warmup" / "nines.bin").write_bytes(np.full(2, 9, np.float32).tobytes())
    (graphs / "good.yaml").write_text(
        GRAPH.format(name="good", module=module, sample="zeros", data="zero_data: true")
    )
    (graphs / "bad.yaml").write_text(
        GRAPH.format(name="bad", module=module, sample="nines", data="input_data_file: nines.bin")
    )
    engine = await Engine.start(None, graphs)
    try:
        calls = sys.modules[module].CALLS
        assert engine.model_ready("good") and not engine.model_ready("bad")
        assert "graph 'bad': warmup sample 'nines' failed" in reason(engine, "bad")
        assert "nines are refused" in reason(engine, "bad")
        good = [c for c in calls if not np.any(c == 9)]
        assert len(good) == 3 and all(c.shape == (2, 2) for c in good)
    finally:
        await engine.stop()


def test_yaml_graph_warmup_errors_name_the_sample(tmp_path: Path) -> None:
    from flowserve.core.errors import SpecError
    from flowserve.spec.graph_yaml import load_graph_file

    path = tmp_path / "g.yaml"
    path.write_text(GRAPH.format(name="g", module="m", sample="bad", data="optional: true"))
    with pytest.raises(SpecError) as info:
        load_graph_file(path)
    assert "sample 'bad'" in str(info.value) and "needs exactly one of zero_data" in str(info.value)


def test_sample_tensors() -> None:
    spec = WarmupSpec(
        "s",
        {
            "a": WarmupInput("INT8", (2,), "random"),
            "b": WarmupInput("BOOL", (1,), "zero"),
            "c": WarmupInput("BYTES", (2,), "random"),
            "d": WarmupInput("FP16", (3,), "zero"),
        },
        batch_size=3,
    )
    batched = sample_tensors(spec, batched=True)
    assert {k: (v.shape, v.dtype.name) for k, v in batched.items()} == {
        "a": ((3, 2), "int8"),
        "b": ((3, 1), "bool"),
        "c": ((3, 2), "object"),
        "d": ((3, 3), "float16"),
    }
    assert np.all((batched["a"] >= 0) & (batched["a"] < 10)) and all(
        len(v) == 8 for v in batched["c"].reshape(-1)
    )
    assert sample_tensors(spec, batched=False)["d"].shape == (3,)


def test_load_waves() -> None:
    order = ["a", "b", "ens", "graph", "c"]
    deps = {"ens": {"a", "b"}, "graph": {"ens", "external"}, "c": set()}
    assert load_waves(order, deps) == [["a", "b", "c"], ["ens"], ["graph"]]
    assert load_waves([], {}) == []


async def test_add_many_creates_instances_at_once() -> None:
    """Three factories meet at a barrier: only a parallel load gets past it."""
    barrier = threading.Barrier(3, timeout=10)
    pool: InstancePool[int] = InstancePool("parallel")

    def make(index: int) -> int:
        barrier.wait()
        return index * 10

    await pool.add_many(make, 3, parallel=3)
    assert pool.instances == [0, 10, 20]
    assert await pool.run_on(2, lambda i, x: i + x, 1) == 21
    await pool.close()


async def test_add_many_keeps_what_loaded_and_raises_the_first_failure() -> None:
    pool: InstancePool[int] = InstancePool("partial")
    closed: list[int] = []

    def make(index: int) -> int:
        if index == 1:
            raise RuntimeError("instance 1 cannot load")
        return index

    with pytest.raises(RuntimeError, match="instance 1"):
        await pool.add_many(make, 3, parallel=2)
    assert pool.instances == [0, 2]
    await pool.close(closed.append)
    assert sorted(closed) == [0, 2]


class _engine:  # noqa: N801 - an async context manager used like a function
    def __init__(self, repo: Path, **kwargs: Any) -> None:
        self.repo = repo
        self.kwargs = kwargs
        self.engine: Engine | None = None

    async def __aenter__(self) -> Engine:
        self.engine = await Engine.start([self.repo], **self.kwargs)
        return self.engine

    async def __aexit__(self, *exc: object) -> None:
        assert self.engine is not None
        await self.engine.stop()


@pytest.mark.slow
def test_failed_warmup_over_http(tmp_path: Path, server_factory: Any) -> None:
    """The example plugin refusing a zero: the model stays unready over HTTP, with the reason."""
    import tritonclient.http as httpclient

    install_example()
    config = (
        'backend: "example_affine"\nmax_batch_size: 2\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\noutput [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'parameters { key: "fail_on" value { string_value: "0" } }\n'
    )
    write_model(tmp_path, "refuses", config + sample("zeros", "zero_data: true", dims="2", input_name="X"))
    write_model(
        tmp_path,
        "warm",
        config.replace('"0"', '"-1"') + sample("zeros", "zero_data: true", dims="2", input_name="X"),
    )
    server = server_factory.start(repositories=(tmp_path,), graphs=(), listeners="http")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_model_ready("warm") and not client.is_model_ready("refuses")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["refuses"]["state"] == "UNAVAILABLE"
        assert "warmup sample 'zeros' failed on instance 0" in index["refuses"]["reason"]
    finally:
        client.close()


def install_example() -> None:
    """The example plugin (examples/flowserve-example-backend), installed for the server
    subprocess to find (as tests/nodes/backends/test_extension_api.py does, and tests)."""
    try:
        metadata.distribution("flowserve-example-backend")
        return
    except metadata.PackageNotFoundError:
        pass
    example = Path(__file__).resolve().parents[2] / "examples" / "flowserve-example-backend"
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    if subprocess.run([*base, "--no-build-isolation", "-e", str(example)], capture_output=True).returncode:
        subprocess.run([*base, "-e", str(example)], check=True, capture_output=True)


def test_model_load_thread_count_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowserve import cli, server
    from flowserve.core.errors import InvalidArgument

    seen: list[int] = []

    async def fake_serve(options: server.ServerOptions) -> int:
        seen.append(options.repository.model_load_threads)
        return 0

    monkeypatch.setattr(server, "serve", fake_serve)
    # cmd_serve arms a watchdog that ends the process after a real server stops: not here
    monkeypatch.setattr(server, "exit_watchdog", lambda *a, **k: None, raising=False)
    assert cli.main(["serve", "--model-repository", str(tmp_path), "--model-load-thread-count", "2"]) == 0
    assert cli.main(["serve", "--model-repository", str(tmp_path)]) == 0
    assert seen == [2, 4]
    with pytest.raises(InvalidArgument, match="load thread count"):
        RepositorySettings(model_load_threads=0)
