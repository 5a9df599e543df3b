"""Conditional routing: the payload goes to the first branch whose case holds; the others are
absent, so the nodes behind them are skipped (see runtime/flow.py)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from flowserve.core.errors import InvalidArgument
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.plan import Signature
from flowserve.spec.schema import NodeSpec, SwitchSpec, TensorSpec

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
}


def choose_branch(spec: SwitchSpec, value: np.ndarray) -> str | None:
    """The branch taken for ``value``: first case that holds, else the default (maybe None)."""
    for case in spec.cases:
        other: Any = case.value
        if value.dtype.kind in "OS" and isinstance(other, str):
            other = other.encode()
        result = np.asarray(_OPS[case.op](value, other), dtype=bool)
        held = bool(result.all() if case.reduce == "all" else result.any())
        if held:
            return case.branch
    return spec.default


def switch_signature(spec: NodeSpec, payload: TensorSpec | None) -> Signature:
    assert spec.switch is not None
    outputs = {b: payload for b in spec.switch.branches}
    return Signature(inputs={"on": None, "payload": None}, outputs=outputs)


class SwitchNode(Node):
    partial_outputs = True  # only the branch taken

    def __init__(self, spec: NodeSpec) -> None:
        if spec.switch is None:
            raise InvalidArgument(f"node '{spec.name}' has no switch settings")
        self.name = spec.name
        self.switch = spec.switch

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        branch = choose_branch(self.switch, inputs["on"])
        return {} if branch is None else {branch: inputs["payload"]}
