from pathlib import Path

import pytest

from flowserve.core.errors import SpecError
from flowserve.graph.compile import compile_graph, shapes_compatible
from flowserve.graph.plan import Signature
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.schema import GraphSpec, NodeSpec, TensorSpec


def t(dtype: str, *dims: int) -> TensorSpec:
    return TensorSpec("", dtype, dims)


# signatures of the fake node targets used below: python "m:Target"
SIGS = {
    "m:F32": Signature({"x": t("FP32", -1)}, {"y": t("FP32", -1)}),
    "m:I32": Signature({"x": t("INT32", -1)}, {"y": t("INT32", -1)}),
    "m:Add": Signature({"a": t("FP32", -1), "b": t("FP32", -1)}, {"sum": t("FP32", -1)}),
    "m:Any": Signature(None, {"y": None}),
    "m:Fixed": Signature({"x": t("FP32", 3)}, {"y": t("FP32", 3)}),
}


def resolve(node: NodeSpec) -> Signature:
    if node.kind == "switch":
        assert node.switch is not None
        return Signature({"on": None, "payload": None}, dict.fromkeys(node.switch.branches))
    sig = SIGS[node.target]
    return Signature(sig.inputs, dict(sig.outputs), sig.optional)


def graph(tmp_path: Path, body: str) -> GraphSpec:
    path = tmp_path / "g.yaml"
    path.write_text(body)
    return load_graph_file(path)


HEAD = "inputs:\n  x: {datatype: FP32, dims: [-1]}\n"


def test_shapes_compatible() -> None:
    assert shapes_compatible((-1, 3), (5, 3))
    assert shapes_compatible((2,), (-1,))
    assert not shapes_compatible((2,), (3,))
    assert not shapes_compatible((2,), (2, 1))


def test_fanout_plan_is_topological_with_consumers(tmp_path: Path) -> None:
    spec = graph(
        tmp_path,
        HEAD
        + """
outputs: {out: join.sum}
nodes:
  join: {python: "m:Add", inputs: {a: left.y, b: right.y}}
  left: {python: "m:F32", inputs: {x: $x}}
  right: {python: "m:F32", inputs: {x: $x}}
""",
    )
    plan = compile_graph(spec, resolve)
    assert [n.name for n in plan.nodes] == ["left", "right", "join"]
    assert plan.consumers["$x"] == (0, 1)
    assert plan.consumers["left.y"] == (2,)
    assert plan.outputs[0].tensor.datatype == "FP32"
    assert plan.output_keys == {"join.sum": ("out",)}


def test_cycle_is_printed(tmp_path: Path) -> None:
    spec = graph(
        tmp_path,
        HEAD
        + """
outputs: {out: c.sum}
nodes:
  a: {python: "m:F32", inputs: {x: c.sum}}
  b: {python: "m:F32", inputs: {x: a.y}}
  c: {python: "m:Add", inputs: {a: b.y, b: $x}}
""",
    )
    with pytest.raises(SpecError) as info:
        compile_graph(spec, resolve)
    assert "cycle: a -> b -> c -> a" in str(info.value)


def test_all_reference_and_type_errors_together(tmp_path: Path) -> None:
    spec = graph(
        tmp_path,
        HEAD
        + """
  unused: {datatype: FP32, dims: [1]}
outputs:
  out: a.nope
  other: ghost.y
nodes:
  a: {python: "m:I32", inputs: {x: $x}}
  b: {python: "m:Fixed", inputs: {x: $missing}}
  c: {python: "m:Add", inputs: {a: $x, extra: $x}}
  d: {python: "m:F32", inputs: {x: c.sum}}
""",
    )
    with pytest.raises(SpecError) as info:
        compile_graph(spec, resolve)
    text = str(info.value)
    src = str(tmp_path / "g.yaml")
    assert all(i.file == src for i in info.value.issues)
    expected = [
        "node 'a': field 'inputs.x': datatype mismatch: '$x' is FP32 but the input expects INT32",
        "node 'b': field 'inputs.x': graph has no input 'missing'",
        "node 'c': field 'inputs.b': required input 'b' is not wired",
        "node 'c': field 'inputs.extra': 'm:Add' has no input 'extra' (inputs: a, b)",
        "field 'outputs.out': node 'a' has no output 'nope' (outputs: y)",
        "field 'outputs.other': references unknown node 'ghost'",
        "field 'inputs.unused': graph input 'unused' is used by no node",
        "node 'd': field 'outputs': no node or graph output uses any output of node 'd'",
    ]
    for message in expected:
        assert message in text, message


def test_shape_mismatch(tmp_path: Path) -> None:
    spec = graph(
        tmp_path,
        "inputs:\n  x: {datatype: FP32, dims: [4]}\noutputs: {out: a.y}\n"
        'nodes:\n  a: {python: "m:Fixed", inputs: {x: $x}}\n',
    )
    with pytest.raises(SpecError, match=r"shape mismatch: '\$x' has shape \[4\] but the input expects \[3\]"):
        compile_graph(spec, resolve)


def test_batched_graph_inputs_get_batch_dim(tmp_path: Path) -> None:
    spec = graph(
        tmp_path,
        "max_batch_size: 8\ninputs:\n  x: {datatype: FP32, dims: [3]}\noutputs: {out: a.y}\n"
        'nodes:\n  a: {python: "m:F32", inputs: {x: $x}}\n',
    )
    with pytest.raises(SpecError, match=r"has shape \[-1, 3\] but the input expects \[-1\]"):
        compile_graph(spec, resolve)


def test_switch_branches_carry_payload_type(tmp_path: Path) -> None:
    spec = graph(
        tmp_path,
        HEAD
        + """
outputs: {out: [a.y, b.y]}
nodes:
  gate: {switch: {input: $x, cases: [{branch: hi, op: gt, value: 0}], default: lo}}
  a: {python: "m:I32", inputs: {x: gate.hi}}
  b: {python: "m:F32", inputs: {x: gate.lo}}
""",
    )
    with pytest.raises(SpecError) as info:
        compile_graph(spec, resolve)
    assert "node 'a': field 'inputs.x': datatype mismatch: 'gate.hi' is FP32" in str(info.value)


def test_untyped_output_must_be_declared(tmp_path: Path) -> None:
    body = HEAD + 'outputs: {out: a.y}\nnodes:\n  a: {python: "m:Any", inputs: {x: $x}}\n'
    with pytest.raises(SpecError, match="datatype or dims unknown"):
        compile_graph(graph(tmp_path, body), resolve)
    typed = body.replace("out: a.y", "out: {from: a.y, datatype: INT8, dims: [2]}")
    plan = compile_graph(graph(tmp_path, typed), resolve)
    assert plan.outputs[0].tensor == TensorSpec("out", "INT8", (2,))
