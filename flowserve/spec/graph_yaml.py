"""YAML pipeline files -> :class:`GraphSpec`, reporting every problem with file, node and field.

Schema (one graph per file)::

    name: classify                    # optional; defaults to the file name without .yaml
    description: text                 # optional
    max_batch_size: 0                 # optional; > 0 means dims below exclude the batch dim
    response_cache: false             # optional; true: identical requests answered from the cache
    warmup:                           # optional; samples run through the graph before it is READY
      - {name: zeros, batch_size: 1, inputs: {image: {datatype: UINT8, dims: [8, 8, 3], zero_data: true}}}
                                      # (or random_data: true, or input_data_file: f.bin under ./warmup/;
                                      # see flowserve.spec.warmup)
    inputs:
      image: {datatype: UINT8, dims: [-1, -1, 3], optional: false}
    outputs:
      label: top1.label               # a node output ...
      score: [a.score, b.score]       # ... or the first present of several ...
      other: {from: x.y, datatype: FP32, dims: [1]}   # ... optionally typed
    nodes:
      pre:   {python: nodes.vision:Preprocess, inputs: {image: $image},
              outputs: {tensor: {datatype: FP32, dims: [3]}}, parameters: {scale: 2}}
      net:   {model: resnet, version: 1, inputs: {input: pre.tensor},
              batching: {max_batch_size: 32, max_queue_delay_us: 500},
              instances: {count: 2, kind: KIND_CPU}}
      inner: {graph: other_graph, inputs: {x: net.output}}
      gate:  {switch: {input: $score, payload: $image, default: low,
                       cases: [{branch: high, op: gt, value: 0.5, reduce: any}]}}
      roll:  {split: {arms: {stable: {model: net, version: 1, weight: 90},
                             canary: {model: net, version: 2, weight: 10}},
                      by_parameter: arm, sticky: $user,        # or sticky_parameter: user
                      shadow: {graph: other_graph, fraction: 0.5}},
              inputs: {input: pre.tensor}}                   # forwarded to the arm taken
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, cast

import yaml

from flowserve.core.datatypes import DATATYPES
from flowserve.core.errors import SpecError, SpecIssue
from flowserve.spec.schema import (
    NODE_KINDS,
    STICKY_INPUT,
    BatchingSpec,
    Binding,
    GraphOutput,
    GraphSpec,
    InstanceSpec,
    NodeKind,
    NodeSpec,
    QueuePolicy,
    Ref,
    ShadowSpec,
    SplitArm,
    SplitSpec,
    SplitTarget,
    SwitchCase,
    SwitchSpec,
    TensorSpec,
)
from flowserve.spec.warmup import warmup_from_yaml

_GRAPH_KEYS = {
    "name",
    "description",
    "max_batch_size",
    "inputs",
    "outputs",
    "nodes",
    "response_cache",
    "warmup",
}
_NODE_KEYS = {
    *NODE_KINDS,
    "version",
    "inputs",
    "outputs",
    "batching",
    "instances",
    "parameters",
    "cache",
}
_SWITCH_OPS = {"eq", "ne", "gt", "ge", "lt", "le"}


class _Issues:
    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[SpecIssue] = []

    def add(self, message: str, node: str | None = None, field: str | None = None) -> None:
        self.items.append(SpecIssue(self.file, message, node, field))


def load_graph_file(path: str | Path) -> GraphSpec:
    """Parse one YAML graph file; raises SpecError listing every problem found."""
    path = Path(path)
    issues = _Issues(str(path))
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        issues.add(f"cannot read YAML: {exc}")
        raise SpecError(issues.items) from None
    spec = parse_graph(doc, path.stem, str(path), issues)
    if issues.items or spec is None:
        raise SpecError(issues.items)
    return spec


def parse_graph(doc: Any, default_name: str, source: str, issues: _Issues) -> GraphSpec | None:
    if not isinstance(doc, dict):
        issues.add("a graph file must be a mapping with inputs, outputs and nodes")
        return None
    for key in sorted(set(doc) - _GRAPH_KEYS):
        issues.add(f"unknown key (expected one of {sorted(_GRAPH_KEYS)})", field=str(key))
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name or "/" in name:
        issues.add(f"graph name must be a non-empty string without '/', got {name!r}", field="name")
        name = default_name
    max_batch = doc.get("max_batch_size", 0)
    if not isinstance(max_batch, int) or max_batch < 0:
        issues.add(f"must be an integer >= 0, got {max_batch!r}", field="max_batch_size")
        max_batch = 0
    inputs = _parse_inputs(doc.get("inputs"), issues)
    nodes: dict[str, NodeSpec] = {}
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, dict) or not raw_nodes:
        issues.add("must be a non-empty mapping of node name to node", field="nodes")
    else:
        for node_name, raw in raw_nodes.items():
            node = _parse_node(str(node_name), raw, issues)
            if node is not None:
                nodes[node.name] = node
    outputs = _parse_outputs(doc.get("outputs"), issues)
    warmup = warmup_from_yaml(
        doc.get("warmup"), Path(source).parent, inputs, max_batch, lambda m, f: issues.add(m, field=f)
    )
    return GraphSpec(
        name=name,
        source=source,
        inputs=inputs,
        outputs=outputs,
        nodes=nodes,
        max_batch_size=max_batch,
        description=str(doc.get("description", "")),
        response_cache=bool(doc.get("response_cache", False)),
        warmup=warmup,
    )


def parse_ref(text: Any) -> Ref | None:
    """``$x`` -> graph input x; ``node.tensor`` -> output of a node; anything else -> None."""
    if not isinstance(text, str) or not text:
        return None
    if text.startswith("$"):
        return Ref(None, text[1:]) if len(text) > 1 else None
    node, dot, tensor = text.partition(".")
    if not dot or not node or not tensor:
        return None
    return Ref(node, tensor)


def _parse_binding(raw: Any, issues: _Issues, node: str | None, field: str) -> Binding | None:
    items = raw if isinstance(raw, list) else [raw]
    refs = []
    for item in items:
        ref = parse_ref(item)
        if ref is None:
            issues.add(f"{item!r} is not a tensor reference ('$input' or 'node.tensor')", node, field)
            return None
        refs.append(ref)
    if not refs:
        issues.add("an empty list references no tensor", node, field)
        return None
    return tuple(refs)


def _parse_tensor(name: str, raw: Any, issues: _Issues, node: str | None, field: str) -> TensorSpec | None:
    if not isinstance(raw, dict):
        issues.add("must be a mapping with datatype and dims", node, field)
        return None
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        issues.add(f"datatype must be one of {sorted(DATATYPES)}, got {datatype!r}", node, field)
        return None
    dims = _parse_dims(raw.get("dims"), issues, node, f"{field}.dims")
    if dims is None:
        return None
    unknown = set(raw) - {"datatype", "dims", "optional"}
    if unknown:
        issues.add(f"unknown keys {sorted(unknown)}", node, field)
    return TensorSpec(name, cast(str, datatype), dims, optional=bool(raw.get("optional", False)))


def _parse_dims(raw: Any, issues: _Issues, node: str | None, field: str) -> tuple[int, ...] | None:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in raw
    ):
        issues.add(f"dims must be a list of integers >= -1, got {raw!r}", node, field)
        return None
    return tuple(raw)


def _parse_inputs(raw: Any, issues: _Issues) -> dict[str, TensorSpec]:
    if not isinstance(raw, dict) or not raw:
        issues.add("must be a non-empty mapping of input name to {datatype, dims}", field="inputs")
        return {}
    out = {}
    for name, spec in raw.items():
        tensor = _parse_tensor(str(name), spec, issues, None, f"inputs.{name}")
        if tensor is not None:
            out[tensor.name] = tensor
    return out


def _parse_outputs(raw: Any, issues: _Issues) -> dict[str, GraphOutput]:
    if not isinstance(raw, dict) or not raw:
        issues.add("must be a non-empty mapping of output name to a node output", field="outputs")
        return {}
    out = {}
    for name, item in raw.items():
        field = f"outputs.{name}"
        datatype: str | None = None
        dims: tuple[int, ...] | None = None
        source = item
        if isinstance(item, dict):
            source = item.get("from")
            datatype = item.get("datatype")
            if datatype is not None and datatype not in DATATYPES:
                issues.add(f"datatype must be one of {sorted(DATATYPES)}", field=field)
            if item.get("dims") is not None:
                dims = _parse_dims(item.get("dims"), issues, None, f"{field}.dims")
        binding = _parse_binding(source, issues, None, field)
        if binding is not None:
            out[str(name)] = GraphOutput(str(name), binding, datatype, dims)
    return out


def _parse_node(name: str, raw: Any, issues: _Issues) -> NodeSpec | None:
    if "." in name or "$" in name or not name:
        issues.add("node names may not contain '.' or '$'", name, "name")
        return None
    if not isinstance(raw, dict):
        issues.add("a node must be a mapping with one kind key: " + ", ".join(NODE_KINDS), name)
        return None
    for key in sorted(set(raw) - _NODE_KEYS):
        issues.add(f"unknown key (expected one of {sorted(_NODE_KEYS)})", name, str(key))
    kinds = [k for k in NODE_KINDS if k in raw]
    if len(kinds) != 1:
        issues.add(f"exactly one kind key expected ({', '.join(NODE_KINDS)}), got {kinds}", name)
        return None
    kind: NodeKind = kinds[0]
    inputs: dict[str, Binding] = {}
    raw_inputs = raw.get("inputs", {})
    if not isinstance(raw_inputs, dict):
        issues.add("must be a mapping of node input name to tensor reference", name, "inputs")
    else:
        for in_name, ref in raw_inputs.items():
            binding = _parse_binding(ref, issues, name, f"inputs.{in_name}")
            if binding is not None:
                inputs[str(in_name)] = binding
    switch = None
    split = None
    target = ""
    if kind == "switch":
        switch = _parse_switch(raw["switch"], issues, name)
        if switch is not None:
            inputs = {"on": (switch.on,), "payload": (switch.payload,)}
    elif kind == "split":
        split = _parse_split(raw["split"], issues, name)
        if split is None:
            return None
        if split.sticky is not None:
            inputs[STICKY_INPUT] = (split.sticky,)
    else:
        target = raw[kind]
        if not isinstance(target, str) or not target:
            issues.add("must name a target", name, kind)
            return None
        if kind == "python" and ":" not in target:
            issues.add(f"must be 'module:Class', got {target!r}", name, kind)
    outputs = _parse_node_outputs(raw.get("outputs"), issues, name)
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        issues.add("must be a mapping", name, "parameters")
        params = {}
    return NodeSpec(
        name=name,
        kind=kind,
        target=target,
        version=str(raw.get("version", "")),
        inputs=inputs,
        outputs=outputs,
        batching=_parse_batching(raw.get("batching"), issues, name),
        instances=_parse_instances(raw.get("instances"), issues, name),
        parameters=params,
        switch=switch,
        split=split,
        cache=bool(raw.get("cache", False)),
    )


def _parse_node_outputs(raw: Any, issues: _Issues, node: str) -> dict[str, TensorSpec | None]:
    if raw is None:
        return {}
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return dict.fromkeys(raw)
    if not isinstance(raw, dict):
        issues.add("must be a list of names or a mapping name -> {datatype, dims}", node, "outputs")
        return {}
    out: dict[str, TensorSpec | None] = {}
    for name, spec in raw.items():
        out[str(name)] = (
            None if spec is None else _parse_tensor(str(name), spec, issues, node, f"outputs.{name}")
        )
    return out


def _parse_switch(raw: Any, issues: _Issues, node: str) -> SwitchSpec | None:
    if not isinstance(raw, dict):
        issues.add("must be a mapping with input, cases and optional payload/default", node, "switch")
        return None
    unknown = set(raw) - {"input", "payload", "cases", "default"}
    if unknown:
        issues.add(
            f"unknown keys {sorted(map(str, unknown))} (expected input, payload, cases, default)",
            node,
            "switch",
        )
    on = parse_ref(raw.get("input"))
    if on is None:
        issues.add(f"{raw.get('input')!r} is not a tensor reference", node, "switch.input")
        return None
    payload = parse_ref(raw["payload"]) if "payload" in raw else on
    if payload is None:
        issues.add(f"{raw.get('payload')!r} is not a tensor reference", node, "switch.payload")
        return None
    cases = []
    raw_cases = raw.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        issues.add("must be a non-empty list of {branch, op, value, reduce}", node, "switch.cases")
        return None
    for i, case in enumerate(raw_cases):
        field = f"switch.cases[{i}]"
        if not isinstance(case, dict) or not isinstance(case.get("branch"), str):
            issues.add("each case needs a branch name", node, field)
            continue
        op = case.get("op")
        if op not in _SWITCH_OPS:
            issues.add(f"op must be one of {sorted(_SWITCH_OPS)}, got {op!r}", node, f"{field}.op")
            continue
        reduce = case.get("reduce", "all")
        if reduce not in ("all", "any"):
            issues.add(f"reduce must be 'all' or 'any', got {reduce!r}", node, f"{field}.reduce")
            continue
        if "value" not in case:
            issues.add("a case needs a value to compare with", node, f"{field}.value")
            continue
        cases.append(SwitchCase(case["branch"], op, case["value"], reduce))
    default = raw.get("default")
    if default is not None and not isinstance(default, str):
        issues.add("must be a branch name", node, "switch.default")
        default = None
    return SwitchSpec(on, payload, tuple(cases), default)


def _parse_target(raw: Any, issues: _Issues, node: str, field: str, extra: set[str]) -> SplitTarget | None:
    """``{model: name, version: 2}`` or ``{graph: name}`` (plus the ``extra`` keys allowed)."""
    if not isinstance(raw, dict):
        issues.add("must be a mapping with 'model' (and maybe 'version') or 'graph'", node, field)
        return None
    unknown = set(raw) - {"model", "graph", "version", *extra}
    if unknown:
        issues.add(f"unknown keys {sorted(map(str, unknown))}", node, field)
    kinds = [k for k in ("model", "graph") if k in raw]
    if len(kinds) != 1 or not isinstance(raw[kinds[0]], str) or not raw[kinds[0]]:
        issues.add("needs exactly one of 'model: NAME' or 'graph: NAME'", node, field)
        return None
    kind: Literal["model", "graph"] = "model" if kinds[0] == "model" else "graph"
    version = raw.get("version", "")
    if kind == "graph" and version not in ("", None):
        issues.add("a graph has no versions", node, f"{field}.version")
    return SplitTarget(kind, raw[kind], str(version) if kind == "model" and version is not None else "")


def _number(raw: Any, issues: _Issues, node: str, field: str, low: float, high: float | None) -> float | None:
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | float)
        or raw < low
        or (high is not None and raw > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        issues.add(f"must be a number {bound}, got {raw!r}", node, field)
        return None
    return float(raw)


def _parse_split(raw: Any, issues: _Issues, node: str) -> SplitSpec | None:
    keys = {"arms", "by_parameter", "sticky", "sticky_parameter", "shadow"}
    if not isinstance(raw, dict):
        issues.add(f"must be a mapping with keys {sorted(keys)}", node, "split")
        return None
    before = len(issues.items)
    unknown = set(raw) - keys
    if unknown:
        issues.add(f"unknown keys {sorted(map(str, unknown))} (expected {sorted(keys)})", node, "split")
    raw_arms = raw.get("arms")
    arms: list[SplitArm] = []
    if not isinstance(raw_arms, dict) or not raw_arms:
        issues.add(
            "must be a non-empty mapping of arm name to {model|graph, version, weight}", node, "split.arms"
        )
    else:
        for arm_name, arm in raw_arms.items():
            field = f"split.arms.{arm_name}"
            target = _parse_target(arm, issues, node, field, {"weight"})
            weight = (
                _number(arm.get("weight", 1), issues, node, f"{field}.weight", 0, None) if target else None
            )
            if target is not None and weight is not None:
                arms.append(SplitArm(str(arm_name), target, weight))
        if arms and len(arms) == len(raw_arms) and sum(a.weight for a in arms) <= 0:
            issues.add("the arms' weights must not all be 0", node, "split.arms")
    for key in ("by_parameter", "sticky_parameter"):
        if not isinstance(raw.get(key, ""), str):
            issues.add("must be a request parameter name", node, f"split.{key}")
    sticky = None
    if raw.get("sticky") is not None:
        sticky = parse_ref(raw["sticky"])
        if sticky is None:
            issues.add(
                f"{raw['sticky']!r} is not a tensor reference ('$input' or 'node.tensor')",
                node,
                "split.sticky",
            )
        elif raw.get("sticky_parameter"):
            issues.add("set 'sticky' (a tensor) or 'sticky_parameter', not both", node, "split.sticky")
    shadow = None
    if raw.get("shadow") is not None:
        extra = {"fraction", "max_in_flight"}
        shadow_raw = raw["shadow"]
        target = _parse_target(shadow_raw, issues, node, "split.shadow", extra)
        if target is not None:
            fraction = _number(shadow_raw.get("fraction", 1.0), issues, node, "split.shadow.fraction", 0, 1)
            limit = shadow_raw.get("max_in_flight", 64)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                issues.add(f"must be an integer >= 1, got {limit!r}", node, "split.shadow.max_in_flight")
                limit = 64
            if fraction is not None:
                shadow = ShadowSpec(target, fraction, limit)
    if len(issues.items) > before:
        return None
    return SplitSpec(
        arms=tuple(arms),
        by_parameter=str(raw.get("by_parameter", "")),
        sticky=sticky,
        sticky_parameter=str(raw.get("sticky_parameter", "")),
        shadow=shadow,
    )


def _parse_batching(raw: Any, issues: _Issues, node: str) -> BatchingSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("max_batch_size"), int):
        issues.add("must be a mapping with an integer max_batch_size", node, "batching")
        return None
    try:
        policy = QueuePolicy(**raw.get("default_queue_policy", {}))
        return BatchingSpec(
            max_batch_size=raw["max_batch_size"],
            preferred_batch_size=tuple(raw.get("preferred_batch_size", ())),
            max_queue_delay_us=int(raw.get("max_queue_delay_us", 0)),
            preserve_ordering=bool(raw.get("preserve_ordering", False)),
            priority_levels=int(raw.get("priority_levels", 0)),
            default_priority_level=int(raw.get("default_priority_level", 0)),
            default_queue_policy=policy,
            priority_queue_policy={
                int(k): QueuePolicy(**v) for k, v in raw.get("priority_queue_policy", {}).items()
            },
        )
    except (TypeError, ValueError, AttributeError) as exc:
        issues.add(f"invalid batching settings: {exc}", node, "batching")
        return None


def _parse_instances(raw: Any, issues: _Issues, node: str) -> InstanceSpec:
    if raw is None:
        return InstanceSpec()
    if not isinstance(raw, dict):
        issues.add("must be a mapping {count, kind}", node, "instances")
        return InstanceSpec()
    count = raw.get("count", 1)
    kind = raw.get("kind", "KIND_AUTO")
    if not isinstance(count, int) or count < 1:
        issues.add(f"count must be an integer >= 1, got {count!r}", node, "instances.count")
        count = 1
    if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"):
        issues.add(f"kind must be KIND_AUTO/CPU/GPU/MODEL, got {kind!r}", node, "instances.kind")
        kind = "KIND_AUTO"
    return InstanceSpec(count=count, kind=kind, gpus=tuple(raw.get("gpus", ())))
