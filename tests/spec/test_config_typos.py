"""A misspelled field or enum value in config.pbtxt (or config.yaml), and a misspelled model in
a graph step: the error says what was probably meant."""

from pathlib import Path

import pytest

from flowserve.core.errors import InvalidArgument
from flowserve.nodes.factory import compile_all
from flowserve.repository.repository import scan_all
from flowserve.spec.repository import scan_graphs
from flowserve.spec.triton import parse_config_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "filename", "hint"),
    [
        ("max_batch_szie: 8", "config.pbtxt", "(did you mean 'max_batch_size'?)"),
        (
            "dynamic_batching { max_queue_delay_microsecond: 100 }",
            "config.pbtxt",
            "(did you mean 'max_queue_delay_microseconds'?)",
        ),
        ('input [{name: "x" data_type: TYPE_FP23 dims: [1]}]', "config.pbtxt", "(did you mean 'TYPE_FP32'?)"),
        ("instance_group [{kind: KIND_CUP}]", "config.pbtxt", "(did you mean 'KIND_CPU'?)"),
        ("max_batch_szie: 8", "config.yaml", "(did you mean 'max_batch_size'?)"),
        ("instance_group: [{kind: KIND_CUP}]", "config.yaml", "(did you mean 'KIND_CPU'?)"),
    ],
)
def test_config_typos_get_a_suggestion(text: str, filename: str, hint: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_config_text(text, filename)
    assert info.value.message.startswith(f"cannot parse {filename}: ")
    assert info.value.message.endswith(hint)


def test_other_parse_errors_get_none() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_config_text("max_batch_size: nope")
    assert "did you mean" not in info.value.message


def test_a_misspelled_model_in_a_graph_step(tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_text(
        """
inputs: {a: {datatype: INT32, dims: [16]}, b: {datatype: INT32, dims: [16]}}
outputs: {s: m.OUTPUT0}
nodes:
  m: {model: simpel, inputs: {INPUT0: $a, INPUT1: $b}}
"""
    )
    assert not scan_graphs(tmp_path).issues
    compiled = compile_all(scan_all([ROOT / "model_repository"], [tmp_path]))
    messages = [str(i) for i in compiled.issues]
    assert (
        f"{tmp_path / 'g.yaml'}: node 'm': field 'model': model 'simpel' is unknown or failed to load "
        "(did you mean 'simple'?)" in messages
    )
