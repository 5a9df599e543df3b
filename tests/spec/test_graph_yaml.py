from pathlib import Path

import pytest

from flowserve.core.errors import SpecError
from flowserve.spec.graph_yaml import load_graph_file, parse_ref
from flowserve.spec.schema import Ref


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_parse_ref() -> None:
    assert parse_ref("$x") == Ref(None, "x")
    assert parse_ref("node.out") == Ref("node", "out")
    assert parse_ref("node.out.with.dots") == Ref("node", "out.with.dots")
    for bad in ("", "$", "node", ".x", "x.", 3, None):
        assert parse_ref(bad) is None


def test_full_graph_parses(tmp_path: Path) -> None:
    spec = load_graph_file(
        write(
            tmp_path,
            """
name: demo
max_batch_size: 4
inputs:
  x: {datatype: FP32, dims: [3]}
outputs:
  y: [a.y, b.y]
  z: {from: a.y, datatype: FP32, dims: [3]}
nodes:
  gate:
    switch: {input: $x, cases: [{branch: big, op: gt, value: 1, reduce: any}], default: small}
  a: {python: mod:A, inputs: {x: gate.big}, parameters: {k: 1}, instances: {count: 2}}
  b: {python: mod:B, inputs: {x: gate.small}, batching: {max_batch_size: 8, max_queue_delay_us: 100}}
""",
        )
    )
    assert spec.name == "demo"
    assert spec.max_batch_size == 4
    assert spec.inputs["x"].dims == (3,)
    assert spec.outputs["y"].source == (Ref("a", "y"), Ref("b", "y"))
    assert spec.outputs["z"].datatype == "FP32"
    gate = spec.nodes["gate"]
    assert gate.switch is not None and gate.switch.branches == ("big", "small")
    assert gate.inputs == {"on": (Ref(None, "x"),), "payload": (Ref(None, "x"),)}
    assert spec.nodes["a"].instances.count == 2
    assert spec.nodes["a"].parameters == {"k": 1}
    batching = spec.nodes["b"].batching
    assert batching is not None and batching.max_batch_size == 8 and batching.max_queue_delay_us == 100


def test_every_problem_is_reported_with_file_node_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
inputs:
  x: {datatype: FLOAT, dims: [3]}
outputs:
  y: a.y
nodes:
  a: {python: nocolon, inputs: {x: not-a-ref}}
  b: {model: m, python: x:Y}
  c: {python: m:C, instances: {count: 0}, bogus: 1}
""",
    )
    with pytest.raises(SpecError) as info:
        load_graph_file(path)
    text = str(info.value)
    issues = info.value.issues
    assert all(i.file == str(path) for i in issues)
    assert "field 'inputs.x': datatype must be one of" in text
    assert "node 'a': field 'python': must be 'module:Class'" in text
    assert "node 'a': field 'inputs.x': 'not-a-ref' is not a tensor reference" in text
    assert "node 'b': exactly one kind key expected" in text
    assert "node 'c': field 'instances.count'" in text
    assert "node 'c': field 'bogus': unknown key" in text
    assert len(issues) == 6


def test_yaml_syntax_error_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "inputs: [unclosed")
    with pytest.raises(SpecError, match="cannot read YAML"):
        load_graph_file(path)
