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
      heavy: {python: nodes.nlp:Embed, inputs: {text: $text},
              instances: {count: 4, kind: KIND_RAY,          # Ray actors (--ray-address);
                          resources: {num_cpus: 1, num_gpus: 0}, max_restarts: -1}}  # see spec/rayspec.py
      inner: {graph: other_graph, inputs: {x: net.output}}
      gate:  {switch: {input: $score, payload: $image, default: low,
                       cases: [{branch: high, op: gt, value: 0.5, reduce: any}]}}
      roll:  {split: {arms: {stable: {model: net, version: 1, weight: 90},
                             canary: {model: net, version: 2, weight: 10}},
                      by_parameter: arm, sticky: $user,        # or sticky_parameter: user
                      shadow: {graph: other_graph, fraction: 0.5}},
              inputs: {input: pre.tensor}}                   # forwarded to the arm taken

The node kinds (the key that makes ``pre`` a python node, how its value parses) are not here:
each is one object in :mod:`flowserve.spec.kinds`, the place to add a kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml

from flowserve.core.datatypes import DATATYPES
from flowserve.core.errors import SpecError
from flowserve.spec.bounds import BOUNDS, out_of_bounds
from flowserve.spec.kinds import KINDS, YAML_KINDS, Issues, parse_ref, unknown_keys
from flowserve.spec.rayspec import KIND_RAY, ray_from_yaml
from flowserve.spec.schema import (
    BatchingSpec,
    Binding,
    GraphOutput,
    GraphSpec,
    InstanceSpec,
    NodeSpec,
    QueuePolicy,
    TensorSpec,
)
from flowserve.spec.suggest import did_you_mean
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
    *YAML_KINDS,
    "version",
    "inputs",
    "outputs",
    "batching",
    "instances",
    "parameters",
    "cache",
}


def load_graph_file(path: str | Path) -> GraphSpec:
    """Parse one YAML graph file; raises SpecError listing every problem found."""
    path = Path(path)
    issues = Issues(str(path))
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        issues.add(f"cannot read YAML: {exc}")
        raise SpecError(issues.items) from None
    spec = parse_graph(doc, path.stem, str(path), issues)
    if issues.items or spec is None:
        raise SpecError(issues.items)
    return spec


def parse_graph(doc: Any, default_name: str, source: str, issues: Issues) -> GraphSpec | None:
    if not isinstance(doc, dict):
        issues.add("a graph file must be a mapping with inputs, outputs and nodes")
        return None
    meant = unknown_keys(doc, sorted(_GRAPH_KEYS), issues, None, None)
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name or "/" in name:
        issues.add(f"graph name must be a non-empty string without '/', got {name!r}", field="name")
        name = default_name
    max_batch = _bounded(doc.get("max_batch_size", 0), "max_batch_size", issues, None, "max_batch_size")
    if max_batch is None:
        max_batch = 0
    # a key misspelled at the top (reported above) is not reported missing as well
    inputs = {} if "inputs" in meant else _parse_inputs(doc.get("inputs"), issues)
    nodes: dict[str, NodeSpec] = {}
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, dict) or not raw_nodes:
        if "nodes" not in meant:
            issues.add("must be a non-empty mapping of node name to node", field="nodes")
    else:
        for node_name, raw in raw_nodes.items():
            node = _parse_node(str(node_name), raw, issues, inputs)
            if node is not None:
                nodes[node.name] = node
    outputs = {} if "outputs" in meant else _parse_outputs(doc.get("outputs"), issues, inputs)
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


def _parse_binding(
    raw: Any, issues: Issues, node: str | None, field: str, inputs: dict[str, TensorSpec]
) -> Binding | None:
    items = raw if isinstance(raw, list) else [raw]
    refs = []
    for item in items:
        ref = parse_ref(item)
        if ref is None:
            # a graph input named without its '$' is the likely slip
            hint = f" (did you mean '${item}'?)" if isinstance(item, str) and item in inputs else ""
            issues.add(f"{item!r} is not a tensor reference ('$input' or 'node.tensor'){hint}", node, field)
            return None
        refs.append(ref)
    if not refs:
        issues.add("an empty list references no tensor", node, field)
        return None
    return tuple(refs)


def _parse_tensor(name: str, raw: Any, issues: Issues, node: str | None, field: str) -> TensorSpec | None:
    if not isinstance(raw, dict):
        issues.add("must be a mapping with datatype and dims", node, field)
        return None
    meant = unknown_keys(raw, ("datatype", "dims", "optional"), issues, node, field)
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        if "datatype" not in meant:
            issues.add(_datatype_problem(datatype), node, field)
        return None
    if "dims" in meant:
        return None
    dims = _parse_dims(raw.get("dims"), issues, node, f"{field}.dims")
    if dims is None:
        return None
    return TensorSpec(name, cast(str, datatype), dims, optional=bool(raw.get("optional", False)))


def _datatype_problem(datatype: Any) -> str:
    hint = did_you_mean(str(datatype), DATATYPES)
    return f"datatype must be one of {sorted(DATATYPES)}, got {datatype!r}{hint}"


def _parse_dims(raw: Any, issues: Issues, node: str | None, field: str) -> tuple[int, ...] | None:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in raw
    ):
        issues.add(f"dims must be a list of integers >= -1, got {raw!r}", node, field)
        return None
    problem = out_of_bounds("rank", len(raw))
    if problem is not None:
        issues.add(f"dims: {problem}", node, field)
        return None
    for i, d in enumerate(raw):
        problem = out_of_bounds("dim", d)
        if problem is not None:
            issues.add(problem, node, f"{field}[{i}]")
            return None
    return tuple(raw)


def _bounded(raw: Any, key: str, issues: Issues, node: str | None, field: str) -> int | None:
    """An integer setting within its bound (spec/bounds.py), else None with the problem told."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        issues.add(f"must be an integer ({BOUNDS[key].what}), got {raw!r}", node, field)
        return None
    problem = out_of_bounds(key, raw)
    if problem is not None:
        issues.add(problem, node, field)
        return None
    return raw


def _parse_inputs(raw: Any, issues: Issues) -> dict[str, TensorSpec]:
    if not isinstance(raw, dict) or not raw:
        issues.add("must be a non-empty mapping of input name to {datatype, dims}", field="inputs")
        return {}
    out = {}
    for name, spec in raw.items():
        tensor = _parse_tensor(str(name), spec, issues, None, f"inputs.{name}")
        if tensor is not None:
            out[tensor.name] = tensor
    return out


def _parse_outputs(raw: Any, issues: Issues, inputs: dict[str, TensorSpec]) -> dict[str, GraphOutput]:
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
                issues.add(_datatype_problem(datatype), field=field)
            if item.get("dims") is not None:
                dims = _parse_dims(item.get("dims"), issues, None, f"{field}.dims")
        binding = _parse_binding(source, issues, None, field, inputs)
        if binding is not None:
            out[str(name)] = GraphOutput(str(name), binding, datatype, dims)
    return out


def _parse_node(name: str, raw: Any, issues: Issues, graph_inputs: dict[str, TensorSpec]) -> NodeSpec | None:
    if "." in name or "$" in name or not name:
        issues.add("node names may not contain '.' or '$'", name, "name")
        return None
    if not isinstance(raw, dict):
        issues.add("a node must be a mapping with one kind key: " + ", ".join(YAML_KINDS), name)
        return None
    meant = unknown_keys(raw, sorted(_NODE_KEYS), issues, name, None)
    kinds = [k for k in YAML_KINDS if k in raw]
    if not kinds and meant & set(YAML_KINDS):
        return None  # its kind key is misspelled, which is reported
    if len(kinds) != 1:
        issues.add(f"exactly one kind key expected ({', '.join(YAML_KINDS)}), got {kinds}", name)
        return None
    kind = KINDS[kinds[0]]
    assert kind.parse is not None
    inputs: dict[str, Binding] = {}
    raw_inputs = raw.get("inputs", {})
    if not isinstance(raw_inputs, dict):
        issues.add("must be a mapping of node input name to tensor reference", name, "inputs")
    else:
        for in_name, ref in raw_inputs.items():
            binding = _parse_binding(ref, issues, name, f"inputs.{in_name}", graph_inputs)
            if binding is not None:
                inputs[str(in_name)] = binding
    parsed = kind.parse(raw[kind.name], inputs, issues, name)
    if parsed is None:
        return None
    outputs = _parse_node_outputs(raw.get("outputs"), issues, name)
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        issues.add("must be a mapping", name, "parameters")
        params = {}
    return NodeSpec(
        name=name,
        kind=kind.name,
        target=parsed.target,
        version=parsed.version or str(raw.get("version", "")),
        inputs=parsed.inputs,
        outputs=outputs,
        batching=_parse_batching(raw.get("batching"), issues, name),
        instances=_parse_instances(raw.get("instances"), issues, name, kind.name),
        parameters=params,
        switch=parsed.switch,
        split=parsed.split,
        cache=bool(raw.get("cache", False)),
    )


def _parse_node_outputs(raw: Any, issues: Issues, node: str) -> dict[str, TensorSpec | None]:
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


# batching: key -> its bound (spec/bounds.py)
_BATCHING_NUMBERS = {
    "max_batch_size": "max_batch_size",
    "max_queue_delay_us": "max_queue_delay_us",
    "priority_levels": "priority_levels",
    "default_priority_level": "priority_levels",
}
_BATCHING_KEYS = (
    *_BATCHING_NUMBERS,
    "preferred_batch_size",
    "preserve_ordering",
    "default_queue_policy",
    "priority_queue_policy",
)
# a queue policy: key -> its bound
_POLICY_NUMBERS = {"default_timeout_us": "queue_timeout_us", "max_queue_size": "max_queue_size"}


def _parse_batching(raw: Any, issues: Issues, node: str) -> BatchingSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        issues.add("must be a mapping with an integer max_batch_size", node, "batching")
        return None
    before = len(issues.items)
    meant = unknown_keys(raw, _BATCHING_KEYS, issues, node, "batching")
    if not isinstance(raw.get("max_batch_size"), int):
        if "max_batch_size" not in meant:
            issues.add("must be a mapping with an integer max_batch_size", node, "batching")
        return None
    for key, bound in _BATCHING_NUMBERS.items():
        if key in raw:
            _bounded(raw[key], bound, issues, node, f"batching.{key}")
    preferred = raw.get("preferred_batch_size", [])
    if not isinstance(preferred, list):
        issues.add(f"must be a list of batch sizes, got {preferred!r}", node, "batching.preferred_batch_size")
        preferred = []
    for i, size in enumerate(preferred):
        _bounded(size, "max_batch_size", issues, node, f"batching.preferred_batch_size[{i}]")
    levels = raw.get("priority_queue_policy", {})
    if not isinstance(levels, dict):
        issues.add(
            "must be a mapping of priority level to queue policy", node, "batching.priority_queue_policy"
        )
        levels = {}
    for level in levels:
        _bounded(level, "priority_levels", issues, node, f"batching.priority_queue_policy[{level!r}]")
    default = _queue_policy(
        raw.get("default_queue_policy", {}), issues, node, "batching.default_queue_policy"
    )
    policies = {
        level: _queue_policy(policy, issues, node, f"batching.priority_queue_policy[{level}]")
        for level, policy in levels.items()
    }
    if len(issues.items) > before or default is None:
        return None
    try:
        return BatchingSpec(
            max_batch_size=raw["max_batch_size"],
            preferred_batch_size=tuple(preferred),
            max_queue_delay_us=int(raw.get("max_queue_delay_us", 0)),
            preserve_ordering=bool(raw.get("preserve_ordering", False)),
            priority_levels=int(raw.get("priority_levels", 0)),
            default_priority_level=int(raw.get("default_priority_level", 0)),
            default_queue_policy=default,
            priority_queue_policy={int(k): v for k, v in policies.items() if v is not None},
        )
    except (TypeError, ValueError) as exc:
        issues.add(f"invalid batching settings: {exc}", node, "batching")
        return None


def _queue_policy(raw: Any, issues: Issues, node: str, field: str) -> QueuePolicy | None:
    """A queue policy {timeout_action, default_timeout_us, allow_timeout_override,
    max_queue_size}, its numbers within their bounds (None: a problem was told)."""
    if not isinstance(raw, dict):
        issues.add("must be a mapping of queue policy settings", node, field)
        return None
    before = len(issues.items)
    unknown_keys(raw, (*_POLICY_NUMBERS, "timeout_action", "allow_timeout_override"), issues, node, field)
    for key, bound in _POLICY_NUMBERS.items():
        if key in raw:
            _bounded(raw[key], bound, issues, node, f"{field}.{key}")
    if raw.get("timeout_action", "REJECT") not in ("REJECT", "DELAY"):
        issues.add(f"must be REJECT or DELAY, got {raw['timeout_action']!r}", node, f"{field}.timeout_action")
    if len(issues.items) > before:
        return None
    try:
        return QueuePolicy(**raw)
    except TypeError as exc:
        issues.add(f"invalid queue policy: {exc}", node, field)
        return None


def _parse_instances(raw: Any, issues: Issues, node: str, node_kind: str) -> InstanceSpec:
    if raw is None:
        return InstanceSpec()
    if not isinstance(raw, dict):
        issues.add("must be a mapping {count, kind[, resources, max_restarts]}", node, "instances")
        return InstanceSpec()
    count = _bounded(raw.get("count", 1), "instances", issues, node, "instances.count") or 1
    kind = raw.get("kind", "KIND_AUTO")
    kinds = ("KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL", KIND_RAY)
    if kind not in kinds:
        hint = did_you_mean(str(kind), kinds)
        issues.add(f"kind must be KIND_AUTO/CPU/GPU/MODEL/RAY, got {kind!r}{hint}", node, "instances.kind")
        kind = "KIND_AUTO"
    if kind != KIND_RAY:
        for key in ("resources", "max_restarts"):
            if key in raw:
                issues.add("only KIND_RAY instances take this (Ray resources)", node, f"instances.{key}")
        return InstanceSpec(count=count, kind=kind, gpus=tuple(raw.get("gpus", ())))
    if node_kind != "python":
        issues.add(
            "KIND_RAY places python nodes' instances on Ray; a repository model asks for it in its "
            "config (parameters flowserve.ray.*)",
            node,
            "instances.kind",
        )
    ray = ray_from_yaml(raw, lambda message, field: issues.add(message, node, field))
    return InstanceSpec(count=count, kind=KIND_RAY, ray=ray)
