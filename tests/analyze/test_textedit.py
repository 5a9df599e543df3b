"""Edits in place that keep a file's comments and layout: YAML (block and flow mappings, keys
added, replaced, deleted) and protobuf text (config.pbtxt), each checked by reading it back."""

from __future__ import annotations

import pytest
import yaml

from flowserve.analyze.space import NodeConfig
from flowserve.analyze.target import pbtxt_edit
from flowserve.analyze.textedit import DELETE, TextEditError, flow, yaml_edit
from flowserve.spec.triton import parse_config_text

GRAPH = """\
# a comment on top
name: g   # the name
nodes:
  a:
    python: m:C   # c
    batching:
      max_batch_size: 8   # mb
      preferred_batch_size:
        - 4
        - 8
    # a comment after a's last key
  b: {python: m:D, inputs: {x: a.y}}

  c:
    model: foo
    instances: {count: 2, kind: KIND_CPU}  # two
# trailing comment
"""


def test_values_are_replaced_and_keys_added_in_the_mapping_s_own_style() -> None:
    out = yaml_edit(
        GRAPH,
        [
            (("nodes", "a", "batching", "max_batch_size"), 16),
            (("nodes", "a", "batching", "preferred_batch_size"), [8, 16]),
            (("nodes", "a", "batching", "max_queue_delay_us"), 200),
            (("nodes", "a", "instances", "count"), 3),
            (("nodes", "b", "batching", "max_batch_size"), 8),
            (("nodes", "c", "instances", "count"), 4),
        ],
    )
    assert out == GRAPH.replace("max_batch_size: 8   # mb", "max_batch_size: 16   # mb").replace(
        "preferred_batch_size:\n        - 4\n        - 8\n",
        "preferred_batch_size: [8, 16]\n      max_queue_delay_us: 200\n    instances: {count: 3}\n",
    ).replace("inputs: {x: a.y}}", "inputs: {x: a.y}, batching: {max_batch_size: 8}}").replace(
        "{count: 2, kind", "{count: 4, kind"
    )
    document = yaml.safe_load(out)
    assert document["nodes"]["a"] == {
        "python": "m:C",
        "batching": {"max_batch_size": 16, "preferred_batch_size": [8, 16], "max_queue_delay_us": 200},
        "instances": {"count": 3},
    }


def test_deleted_keys_take_their_lines_or_their_entry() -> None:
    added = yaml_edit(GRAPH, [(("nodes", "b", "batching", "max_batch_size"), 8)])
    out = yaml_edit(
        added,
        [
            (("nodes", "a", "batching"), DELETE),
            (("nodes", "b", "batching"), DELETE),
            (("nodes", "c", "batching"), DELETE),  # absent: nothing to do
            (("nodes", "c", "instances", "gpus"), DELETE),
        ],
    )
    assert out == GRAPH.replace(
        "    batching:\n      max_batch_size: 8   # mb\n      preferred_batch_size:\n        - 4\n        - 8\n",
        "",
    )
    flows = "x: {a: 1, b: 2, c: 3}\n"
    assert yaml_edit(flows, [(("x", "a"), DELETE)]) == "x: {b: 2, c: 3}\n"
    assert yaml_edit(flows, [(("x", "b"), DELETE)]) == "x: {a: 1, c: 3}\n"
    assert yaml_edit("x: {a: 1}\n", [(("x", "a"), DELETE), (("x", "b"), 2)]) == "x: {b: 2}\n"


def test_a_null_or_scalar_in_the_way_is_replaced_by_a_mapping() -> None:
    assert yaml_edit("a:\n  batching:\n  x: 1\n", [(("a", "batching", "max_batch_size"), 4)]) == (
        "a:\n  batching: {max_batch_size: 4}\n  x: 1\n"
    )
    assert yaml_edit("a: 3  # three\n", [(("a", "b"), [1])]) == "a: {b: [1]}  # three\n"


def test_what_cannot_be_edited_in_place_says_so() -> None:
    with pytest.raises(TextEditError, match="not a mapping"):
        yaml_edit("- a\n", [(("a",), 1)])
    with pytest.raises(TextEditError, match="only key"):
        yaml_edit("a:\n  b: 1\n", [(("a", "b"), DELETE)])
    assert flow({"k": "two words", "q": None, "t": True, "s": "KIND_CPU"}) == (
        '{k: "two words", q: null, t: true, s: KIND_CPU}'
    )
    assert flow("yes") == '"yes"'


CONFIG = """\
# a model
name: "m"
backend: "python"
max_batch_size: 8  # rows
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [
  {
    kind: KIND_CPU  # here
    count: 1
  }
]
dynamic_batching {
  # wait a little
  max_queue_delay_microseconds: 100
  preferred_batch_size: 4
  preferred_batch_size: 8
}
"""


@pytest.mark.parametrize(
    ("node", "tail"),
    [
        (
            NodeConfig(2, 8, (8,), 500),
            "    count: 2\n  }\n]\ndynamic_batching {\n  # wait a little\n"
            "  max_queue_delay_microseconds: 500\n  preferred_batch_size: [ 8 ]\n}\n",
        ),
        (
            NodeConfig(3, 4, (), 0),
            "    count: 3\n  }\n]\ndynamic_batching {\n  # wait a little\n  max_queue_delay_microseconds: 0\n}\n",
        ),
        (NodeConfig(1, 0, (), 0), "    count: 1\n  }\n]\n"),
    ],
)
def test_a_config_pbtxt_is_edited_in_place(node: NodeConfig, tail: str) -> None:
    out = pbtxt_edit(CONFIG, node, 1)
    assert out.startswith("# a model\n") and out.endswith(tail)
    config = parse_config_text(out)
    assert config.instance_group[0].count == node.instances
    assert config.max_batch_size == (node.max_batch_size or 8)
    assert config.HasField("dynamic_batching") == bool(node.max_batch_size)
    assert list(config.dynamic_batching.preferred_batch_size) == list(node.preferred)


def test_a_config_without_groups_or_batching_gets_them_added() -> None:
    bare = 'name: "m"\nmax_batch_size: 8\n'
    assert pbtxt_edit(bare, NodeConfig(1, 0, (), 0), 1) == bare  # as served: nothing to add
    assert pbtxt_edit(bare, NodeConfig(2, 4, (2, 4), 0), 1) == (
        'name: "m"\nmax_batch_size: 4\ninstance_group [ { count: 2 } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 0 preferred_batch_size: [ 2, 4 ] }\n"
    )
    two = bare + "instance_group [ { count: 1 }, { count: 1 kind: KIND_GPU } ]\n"
    with pytest.raises(TextEditError, match="several instance groups"):
        pbtxt_edit(two, NodeConfig(3, 0, (), 0), 2)
