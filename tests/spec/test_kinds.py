"""The node-kind registry: one table of kinds, each with a builder in nodes/, known to the YAML
parser in the order its error messages list them."""

from __future__ import annotations

from flowserve.nodes.kinds import BUILDERS
from flowserve.spec.kinds import KINDS, YAML_KINDS, node_targets
from flowserve.spec.schema import NodeSpec


def test_every_kind_has_a_builder_and_the_yaml_kinds_keep_their_order() -> None:
    assert set(BUILDERS) == set(KINDS)
    assert YAML_KINDS == ("model", "python", "switch", "graph", "split", "remote")
    assert KINDS["backend"].parse is None and KINDS["backend"].model_batching


def test_only_steps_call_their_target() -> None:
    assert node_targets(NodeSpec("n", "model", target="m")) == ("m",)
    assert node_targets(NodeSpec("n", "graph", target="g")) == ("g",)
    assert node_targets(NodeSpec("n", "python", target="a:B")) == ()
    assert node_targets(NodeSpec("n", "backend", target="m")) == ()
