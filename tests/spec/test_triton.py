from pathlib import Path

import pytest

from flowserve.nodes.backends import autocompletions
from flowserve.spec.repository import scan_repository
from flowserve.spec.schema import Ref
from flowserve.spec.triton import config_to_json, parse_config_text

ROOT = Path(__file__).resolve().parents[2]


def make_model(
    root: Path, name: str, config: str, versions: tuple[str, ...] = ("1",), file: str = "model.py"
) -> Path:
    model = root / name
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    for v in versions:
        (model / v).mkdir()
        (model / v / file).write_text("")
    return model


def test_bundled_repository_scans_clean() -> None:
    scan = scan_repository(ROOT / "model_repository", autocompletions())
    assert scan.issues == []
    simple = scan.models["simple"]
    assert simple.backend == "python"
    assert simple.max_batch_size == 8
    assert [t.name for t in simple.inputs] == ["INPUT0", "INPUT1"]
    assert simple.inputs[0].datatype == "INT32" and simple.inputs[0].dims == (16,)
    assert simple.inputs[0].full_shape(simple.max_batch_size) == (-1, 16)
    ens = scan.models["simple_ensemble"]
    assert ens.graph is not None
    assert list(ens.graph.nodes) == ["simple", "simple_1"]
    assert ens.graph.nodes["simple_1"].inputs["INPUT0"] == (Ref("simple", "OUTPUT0"),)
    assert ens.graph.outputs["OUTPUT0"].source == (Ref("simple_1", "OUTPUT0"),)


def test_version_policies(tmp_path: Path) -> None:
    base = 'backend: "python"\ninput [{name: "X" data_type: TYPE_FP32 dims: [1]}]\noutput [{name: "Y" data_type: TYPE_FP32 dims: [1]}]\n'
    make_model(tmp_path, "latest", base, ("1", "2", "3", "07", "x"))
    make_model(tmp_path, "latest2", base + "version_policy: { latest { num_versions: 2 } }", ("1", "2", "3"))
    make_model(tmp_path, "every", base + "version_policy: { all {} }", ("1", "3"))
    make_model(tmp_path, "some", base + "version_policy: { specific { versions: [1, 3] } }", ("1", "2", "3"))
    scan = scan_repository(tmp_path, autocompletions())
    assert scan.issues == []
    assert list(scan.models["latest"].versions) == [3]
    assert list(scan.models["latest2"].versions) == [2, 3]
    assert list(scan.models["every"].versions) == [1, 3]
    assert list(scan.models["some"].versions) == [1, 3]


def test_backend_from_platform_and_files(tmp_path: Path) -> None:
    io = 'input [{name: "X" data_type: TYPE_FP32 dims: [1]}]\noutput [{name: "Y" data_type: TYPE_FP32 dims: [1]}]\n'
    make_model(tmp_path, "by_platform", 'platform: "onnxruntime_onnx"\n' + io, file="model.onnx")
    make_model(tmp_path, "by_file", io, file="model.pt")
    scan = scan_repository(tmp_path, autocompletions())
    assert scan.models["by_platform"].backend == "onnxruntime"
    assert scan.models["by_platform"].default_model_filename == "model.onnx"
    assert scan.models["by_file"].backend == "pytorch"
    assert scan.models["by_file"].platform == "pytorch_libtorch"


def test_reshape_optional_and_dynamic_batching(tmp_path: Path) -> None:
    make_model(
        tmp_path,
        "m",
        """
backend: "python"
max_batch_size: 4
input [{name: "X" data_type: TYPE_FP32 dims: [4] reshape: {shape: [2, 2]}},
       {name: "O" data_type: TYPE_INT64 dims: [-1] optional: true}]
output [{name: "Y" data_type: TYPE_STRING dims: [1]}]
dynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 300
  default_queue_policy { max_queue_size: 5 timeout_action: DELAY default_timeout_microseconds: 10 } }
""",
    )
    model = scan_repository(tmp_path, autocompletions()).models["m"]
    assert model.inputs[0].reshape == (2, 2)
    assert model.inputs[1].optional and model.inputs[1].dims == (-1,)
    assert model.outputs[0].datatype == "BYTES"
    assert model.batching is not None
    assert model.batching.preferred_batch_size == (2, 4)
    assert model.batching.max_queue_delay_us == 300
    assert model.batching.default_queue_policy.max_queue_size == 5
    assert model.batching.default_queue_policy.timeout_action == "DELAY"


def test_bad_models_are_reported_and_do_not_hide_good_ones(tmp_path: Path) -> None:
    io = 'backend: "python"\ninput [{name: "X" data_type: TYPE_FP32 dims: [1]}]\noutput [{name: "Y" data_type: TYPE_FP32 dims: [1]}]\n'
    make_model(tmp_path, "good", io)
    make_model(tmp_path, "syntax", "this is { not pbtxt")
    make_model(tmp_path, "wrongname", 'name: "other"\n' + io)
    make_model(tmp_path, "noversion", io, versions=())
    scan = scan_repository(tmp_path, autocompletions())
    assert list(scan.models) == ["good"]
    assert set(scan.failed) == {"syntax", "wrongname", "noversion"}
    text = "\n".join(str(i) for i in scan.issues)
    assert "cannot parse config.pbtxt" in text
    assert "name 'other' differs from directory 'wrongname'" in text
    assert "no version directory" in text


def test_ensemble_errors_name_step_and_field(tmp_path: Path) -> None:
    make_model(
        tmp_path,
        "ens",
        """
platform: "ensemble"
input [{name: "IN" data_type: TYPE_FP32 dims: [1]}]
output [{name: "OUT" data_type: TYPE_FP32 dims: [1]}]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "X" value: "nowhere" } output_map { key: "Y" value: "t" } },
  { model_name: "b" model_version: -1 input_map { key: "X" value: "t" } output_map { key: "Y" value: "t" } } ] }
""",
    )
    scan = scan_repository(tmp_path, autocompletions())
    text = "\n".join(str(i) for i in scan.issues)
    assert "node 'a': field 'input_map.X': ensemble tensor 'nowhere' is not an ensemble input" in text
    assert "node 'b': field 'output_map': ensemble tensor 't' is produced more than once" in text
    assert "ensemble output 'OUT' is not produced by any step" in text


def test_config_yaml_is_accepted(tmp_path: Path) -> None:
    model = tmp_path / "y"
    (model / "1").mkdir(parents=True)
    (model / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 2\ninput: [{name: X, data_type: TYPE_INT8, dims: [3]}]\n"
        "output: [{name: Y, data_type: TYPE_INT8, dims: [3]}]\n"
    )
    spec = scan_repository(tmp_path, autocompletions()).models["y"]
    assert spec.inputs[0].datatype == "INT8" and spec.max_batch_size == 2


def test_config_json_matches_triton_shape() -> None:
    config = parse_config_text(
        'name: "m" max_batch_size: 8 input [{name: "X" data_type: TYPE_FP32 dims: [16]}]\n'
        "dynamic_batching { max_queue_delay_microseconds: 500 }"
    )
    doc = config_to_json(config)
    assert doc["max_batch_size"] == 8
    assert doc["input"][0]["dims"] == [16]  # int64 as JSON numbers, not strings
    assert doc["input"][0]["data_type"] == "TYPE_FP32"
    assert doc["input"][0]["optional"] is False  # defaults included
    assert doc["platform"] == ""
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert "sequence_batching" not in doc  # unset messages are omitted


@pytest.mark.parametrize("name", ["config.pbtxt"])
def test_parse_error_message(name: str) -> None:
    from flowserve.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"cannot parse config\.pbtxt"):
        parse_config_text("max_batch_size: 'x'", name)
