"""One typo is one error with a "did you mean", never a cascade of follow-up errors about what
the typo left unwired or unused."""

from pathlib import Path

import pytest

from flowserve.core.errors import InvalidArgument, SpecError
from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Signature
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.schema import NodeSpec, TensorSpec
from flowserve.spec.suggest import closest, did_you_mean


def t(dtype: str, *dims: int) -> TensorSpec:
    return TensorSpec("", dtype, dims)


SIGS = {
    "m:Pre": Signature({"image": t("FP32", -1)}, {"tensor": t("FP32", -1)}),
    "m:Add": Signature({"a": t("FP32", -1), "b": t("FP32", -1)}, {"sum": t("FP32", -1)}),
}


def resolve(node: NodeSpec) -> Signature:
    if node.target not in SIGS:
        raise InvalidArgument(f"module 'm' has no attribute '{node.target.partition(':')[2]}'")
    sig = SIGS[node.target]
    return Signature(sig.inputs, dict(sig.outputs), sig.optional)


GOOD = """
inputs:
  image: {datatype: FP32, dims: [-1]}
outputs: {out: post.sum}
nodes:
  pre: {python: "m:Pre", inputs: {image: $image}}
  post: {python: "m:Add", inputs: {a: pre.tensor, b: $image}}
"""


def issues_of(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "g.yaml"
    path.write_text(body)
    with pytest.raises(SpecError) as info:
        compile_graph(load_graph_file(path), resolve)
    prefix = f"{path}: "
    return [str(i).removeprefix(prefix) for i in info.value.issues]


def test_the_good_graph_compiles(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(GOOD)
    assert [n.name for n in compile_graph(load_graph_file(path), resolve).nodes] == ["pre", "post"]


@pytest.mark.parametrize(
    ("typo", "fixed", "message"),
    [
        (
            "a: pre.tensor",
            "a: pre.tesnor",
            "node 'post': field 'inputs.a': node 'pre' has no output 'tesnor' (did you mean 'tensor'?) "
            "(outputs: tensor)",
        ),
        (
            "a: pre.tensor",
            "a: pr.tensor",
            "node 'post': field 'inputs.a': references unknown node 'pr' (did you mean 'pre'?)",
        ),
        (
            "image: $image}",
            "image: $imgae}",
            "node 'pre': field 'inputs.image': graph has no input 'imgae' (did you mean '$image'?) "
            "(inputs: image)",
        ),
        (
            "{a: pre.tensor, b: $image}",
            "{a: pre.tensor, bb: $image}",
            "node 'post': field 'inputs.bb': 'm:Add' has no input 'bb' (did you mean 'b'?) (inputs: a, b)",
        ),
        (
            "out: post.sum",
            "out: post.summ",
            "field 'outputs.out': node 'post' has no output 'summ' (did you mean 'sum'?) (outputs: sum)",
        ),
    ],
)
def test_one_typo_is_one_error(tmp_path: Path, typo: str, fixed: str, message: str) -> None:
    assert typo in GOOD
    assert issues_of(tmp_path, GOOD.replace(typo, fixed, 1)) == [message]


def test_a_node_that_fails_to_resolve_leaves_its_neighbours_alone(tmp_path: Path) -> None:
    """'pre' feeds a node whose class is misspelled: only that node's error, not 'no node uses
    any output of node pre' nor an untyped graph output."""
    body = GOOD.replace('"m:Add"', '"m:Ad"')
    assert issues_of(tmp_path, body) == ["node 'post': field 'python': module 'm' has no attribute 'Ad'"]


def test_unused_is_still_told_when_nothing_names_it(tmp_path: Path) -> None:
    body = GOOD.replace("a: pre.tensor", "a: $image")
    assert issues_of(tmp_path, body) == [
        "node 'pre': field 'outputs': no node or graph output uses any output of node 'pre'"
    ]


def test_closest_names() -> None:
    assert closest("tesnor", ["tensor", "other"]) == ["tensor"]
    assert closest("Image", ["image", "imagine"]) == ["image"]  # a case slip is always offered
    assert closest("zzz", ["tensor"]) == []
    assert closest("x", ["x"]) == []  # the name itself is no suggestion
    assert did_you_mean("imgae", {"image": 1}, "$") == " (did you mean '$image'?)"
    assert did_you_mean("q", []) == ""
