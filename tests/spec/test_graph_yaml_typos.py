"""A misspelled key, kind, datatype or reference in a YAML graph: one error that says what was
probably meant, and nothing more about what the typo left missing."""

from pathlib import Path

import pytest

from flowserve.core.errors import SpecError
from flowserve.spec.graph_yaml import load_graph_file

GOOD = """
inputs:
  image: {datatype: FP32, dims: [3]}
outputs: {out: pre.tensor}
nodes:
  pre:
    python: nodes.x:Pre
    inputs: {image: $image}
    outputs: {tensor: {datatype: FP32, dims: [3]}}
    batching: {max_batch_size: 4, max_queue_delay_us: 100}
    instances: {count: 1, kind: KIND_CPU}
"""


def issues_of(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "g.yaml"
    path.write_text(body)
    with pytest.raises(SpecError) as info:
        load_graph_file(path)
    return [str(i).removeprefix(f"{path}: ") for i in info.value.issues]


def test_the_good_graph_parses(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(GOOD)
    assert list(load_graph_file(path).nodes) == ["pre"]


@pytest.mark.parametrize(
    ("typo", "fixed", "message"),
    [
        ("outputs: {out", "ouputs: {out", "field 'ouputs': unknown key (did you mean 'outputs'?)"),
        ("\nnodes:", "\nnode:", "field 'node': unknown key (did you mean 'nodes'?)"),
        (
            "python: nodes",
            "pyhton: nodes",
            "node 'pre': field 'pyhton': unknown key (did you mean 'python'?)",
        ),
        (
            "inputs: {image: $",
            "inptus: {image: $",
            "node 'pre': field 'inptus': unknown key (did you mean 'inputs'?)",
        ),
        (
            "{datatype: FP32, dims: [3]}}\n    batching",
            "{datatype: FP32, dim: [3]}}\n    batching",
            "node 'pre': field 'outputs.tensor': unknown keys ['dim'] (did you mean 'dims'?)",
        ),
        (
            "image: {datatype: FP32",
            "image: {datatype: FP23",
            "field 'inputs.image': datatype must be one of ['BF16', 'BOOL', 'BYTES', 'FP16', 'FP32', "
            "'FP64', 'INT16', 'INT32', 'INT64', 'INT8', 'UINT16', 'UINT32', 'UINT64', 'UINT8'], got 'FP23' "
            "(did you mean 'FP32'?)",
        ),
        (
            "{image: $image}",
            "{image: image}",
            "node 'pre': field 'inputs.image': 'image' is not a tensor reference ('$input' or "
            "'node.tensor') (did you mean '$image'?)",
        ),
        (
            "max_queue_delay_us: 100",
            "max_queue_delay: 100",
            "node 'pre': field 'batching': unknown keys ['max_queue_delay'] (did you mean 'max_queue_delay_us'?)",
        ),
        (
            "max_batch_size: 4,",
            "max_batch: 4,",
            "node 'pre': field 'batching': unknown keys ['max_batch'] (did you mean 'max_batch_size'?)",
        ),
        (
            "kind: KIND_CPU",
            "kind: KIND_CUP",
            "node 'pre': field 'instances.kind': kind must be KIND_AUTO/CPU/GPU/MODEL/RAY, got 'KIND_CUP' "
            "(did you mean 'KIND_CPU'?)",
        ),
    ],
)
def test_one_typo_is_one_error(tmp_path: Path, typo: str, fixed: str, message: str) -> None:
    assert typo in GOOD
    assert issues_of(tmp_path, GOOD.replace(typo, fixed, 1)) == [message]


def test_a_key_like_nothing_lists_what_is_allowed(tmp_path: Path) -> None:
    (issue,) = issues_of(tmp_path, GOOD.replace("    instances:", "    colour: red\n    instances:"))
    assert issue.startswith("node 'pre': field 'colour': unknown key (expected one of batching, cache, ")


def test_a_lower_case_datatype_is_offered_in_capitals(tmp_path: Path) -> None:
    (issue,) = issues_of(tmp_path, GOOD.replace("image: {datatype: FP32", "image: {datatype: fp32"))
    assert issue.endswith("got 'fp32' (did you mean 'FP32'?)")


def test_switch_op_and_keys(tmp_path: Path) -> None:
    body = """
inputs: {x: {datatype: FP32, dims: [1]}}
outputs: {out: [gate.hi, gate.lo]}
nodes:
  gate: {switch: {input: $x, cases: [{branch: hi, op: eqq, value: 1}], default: lo, payloud: $x}}
"""
    assert issues_of(tmp_path, body) == [
        "node 'gate': field 'switch': unknown keys ['payloud'] (did you mean 'payload'?)",
        "node 'gate': field 'switch.cases[0].op': op must be one of ['eq', 'ge', 'gt', 'le', 'lt', 'ne'], "
        "got 'eqq' (did you mean 'eq'?)",
    ]
