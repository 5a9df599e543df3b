"""The compiled request check gives exactly the answers of validate_inputs (pure, no loop)."""

from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import InvalidArgument
from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Plan, Signature
from flowserve.runtime.validate import InputValidator, validate_inputs
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.schema import NodeSpec


def resolve(node: NodeSpec) -> Signature:
    return Signature(None, dict.fromkeys(node.outputs or ["y"]))


def plan(tmp_path: Path, inputs: str, max_batch_size: int = 8) -> Plan:
    path = tmp_path / "g.yaml"
    path.write_text(
        f"max_batch_size: {max_batch_size}\ninputs:\n{inputs}"
        "outputs: {y: {from: n.y, datatype: FP32, dims: [4]}}\n"
        "nodes:\n  n: {python: 'm:A', inputs: {a: $a, b: $b}}\n"
    )
    return compile_graph(load_graph_file(path), resolve)


PLAIN = "  a: {datatype: FP32, dims: [4]}\n  b: {datatype: INT32, dims: [-1, 2]}\n"
OPTIONAL = "  a: {datatype: FP32, dims: [4]}\n  b: {datatype: INT32, dims: [-1, 2], optional: true}\n"

f32 = np.zeros((2, 4), np.float32)
i32 = np.zeros((2, 3, 2), np.int32)
CASES = [
    {"a": f32, "b": i32},  # valid
    {"a": f32},  # missing
    {"a": f32, "b": i32, "c": f32},  # unknown
    {"a": f32.astype(np.float64), "b": i32},  # dtype
    {"a": f32.astype(">f4"), "b": i32},  # big-endian FP32: an unusual but valid dtype
    {"a": np.zeros((2, 5), np.float32), "b": i32},  # fixed dim
    {"a": np.zeros((4,), np.float32), "b": i32},  # rank
    {"a": np.zeros((9, 4), np.float32), "b": np.zeros((9, 1, 2), np.int32)},  # batch too big
    {"a": f32, "b": np.zeros((3, 1, 2), np.int32)},  # batch sizes disagree
    {"a": [1.0, 2.0], "b": i32},  # not an array
]


def outcome(check: object, inputs: dict[str, object]) -> object:
    try:
        return check(inputs)  # type: ignore[operator]
    except InvalidArgument as exc:
        return ("error", exc.message)


@pytest.mark.parametrize("inputs", [PLAIN, OPTIONAL])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_compiled_check_matches_validate_inputs(tmp_path: Path, inputs: str, case: int) -> None:
    p = plan(tmp_path, inputs)
    request = CASES[case]
    assert outcome(InputValidator(p), request) == outcome(lambda x: validate_inputs(p, x), request)


def test_unbatched_plan(tmp_path: Path) -> None:
    p = plan(tmp_path, "  a: {datatype: FP32, dims: [2, 4]}\n  b: {datatype: INT32, dims: [-1]}\n", 0)
    request = {"a": f32, "b": np.zeros(7, np.int32)}
    assert InputValidator(p)(request) == validate_inputs(p, request) == 1
