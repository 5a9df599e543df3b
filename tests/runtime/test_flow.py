"""The pure dataflow state: no event loop, no sleeps."""

from pathlib import Path

from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Plan, Signature
from flowserve.runtime.flow import Flow
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.schema import NodeSpec


def resolve(node: NodeSpec) -> Signature:
    if node.switch is not None:
        return Signature({"on": None, "payload": None}, dict.fromkeys(node.switch.branches))
    return Signature(None, dict.fromkeys(node.outputs or ["y"]))


def plan(tmp_path: Path, body: str) -> Plan:
    path = tmp_path / "g.yaml"
    path.write_text(
        "inputs:\n  x: {datatype: FP32, dims: [-1]}\n  o: {datatype: FP32, dims: [-1], optional: true}\n"
        + body
    )
    return compile_graph(load_graph_file(path), resolve)


SWITCHED = """
outputs: {out: {from: [big.y, small.y], datatype: FP32, dims: [-1]}, o: {from: useo.y, datatype: FP32, dims: [-1]}}
nodes:
  gate: {switch: {input: $x, cases: [{branch: hi, op: gt, value: 0}], default: lo}}
  big: {python: "m:A", inputs: {x: gate.hi}}
  after_big: {python: "m:A", inputs: {x: big.y}}
  small: {python: "m:A", inputs: {x: gate.lo}}
  join: {python: "m:A", inputs: {x: [after_big.y, small.y]}}
  useo: {python: "m:A", inputs: {x: $o, z: join.y}}
"""


def names(p: Plan, indexes: list[int]) -> list[str]:
    return [p.nodes[i].name for i in indexes]


def test_switch_skips_the_branch_not_taken(tmp_path: Path) -> None:
    p = plan(tmp_path, SWITCHED)
    flow = Flow(p)
    assert names(p, flow.start({"$x"})) == ["gate"]
    # gate takes "lo": big and everything behind it is skipped, small runs
    ready = flow.finish(p.node("gate").index, {"lo"})
    assert names(p, ready) == ["small"]
    assert flow.skipped == ["big", "after_big"]
    # join takes the first present of [after_big.y, small.y]
    ready = flow.finish(p.node("small").index, {"y"})
    assert names(p, ready) == ["join"]
    assert flow.chosen[p.node("join").index] == {"x": "small.y"}
    assert not flow.done
    # useo needs the absent optional input $o -> skipped, so output "o" is absent
    ready = flow.finish(p.node("join").index, {"y"})
    assert ready == []
    assert "useo" in flow.skipped
    assert flow.done
    assert flow.output_key(p.outputs[0].keys) == "small.y"
    assert flow.output_key(p.outputs[1].keys) == ""


def test_first_present_waits_for_earlier_candidates(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        """
outputs: {out: {from: j.y, datatype: FP32, dims: [-1]}}
nodes:
  a: {python: "m:A", inputs: {x: $x}}
  b: {python: "m:A", inputs: {x: $x}}
  j: {python: "m:A", inputs: {x: [a.y, b.y], o: $o}}
""",
    )
    flow = Flow(p)
    assert names(p, flow.start({"$x", "$o"})) == ["a", "b"]
    # b finishes first, but a (earlier candidate) is still undecided
    assert flow.finish(p.node("b").index, {"y"}) == []
    assert names(p, flow.finish(p.node("a").index, {"y"})) == ["j"]
    assert flow.chosen[p.node("j").index] == {"x": "a.y", "o": "$o"}


def test_node_without_inputs_is_ready_at_start(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        """
outputs: {out: {from: u.y, datatype: FP32, dims: [-1]}}
nodes:
  c: {python: "m:Const", outputs: [y]}
  u: {python: "m:A", inputs: {x: $x, c: c.y, o: $o}}
""",
    )
    flow = Flow(p)
    assert names(p, flow.start({"$x", "$o"})) == ["c"]
