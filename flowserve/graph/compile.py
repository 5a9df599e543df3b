"""GraphSpec -> Plan, validated once at load.

Checks: every reference names a graph input or an existing node output; node inputs match
what the node accepts; datatypes and shapes agree along every edge; the graph is acyclic
(the cycle is printed); every node's outputs and every graph input are used; every graph
output is produced and typed. All problems are returned together, each naming file, node and
field. Node signatures come from an injected resolver, so this module imports no node kind.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx

from flowserve.core.errors import FlowserveError, SpecError, SpecIssue
from flowserve.graph.plan import Plan, PlanNode, PlanOutput, Signature
from flowserve.spec.schema import GraphOutput, GraphSpec, NodeSpec, Ref, TensorSpec

SignatureResolver = Callable[[NodeSpec], Signature]


def shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Same rank, and each dimension equal or variable (-1) on either side."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def compile_graph(spec: GraphSpec, resolve: SignatureResolver) -> Plan:
    """Validate ``spec`` and build its plan; raises SpecError listing every problem."""
    issues: list[SpecIssue] = []

    def issue(message: str, node: str | None = None, field: str | None = None) -> None:
        issues.append(SpecIssue(spec.source, message, node, field))

    inputs = {
        name: TensorSpec(t.name, t.datatype, t.full_shape(spec.max_batch_size), t.optional)
        for name, t in spec.inputs.items()
    }
    signatures: dict[str, Signature] = {}
    for node in spec.nodes.values():
        try:
            signatures[node.name] = resolve(node)
        except SpecError as exc:
            issues.extend(
                SpecIssue(spec.source, i.message, i.node or node.name, i.field or node.kind)
                for i in exc.issues
            )
        except FlowserveError as exc:
            issue(exc.message, node.name, node.kind)

    known: dict[str, TensorSpec | None] = {f"${n}": t for n, t in inputs.items()}
    for name, sig in signatures.items():
        for out, tensor in sig.outputs.items():
            known[f"{name}.{out}"] = tensor
    _type_switch_branches(spec, signatures, known)

    def check_ref(ref: Ref, node: str | None, field: str) -> bool:
        if ref.key in known:
            return True
        if ref.node is None:
            issue(f"graph has no input '{ref.tensor}' (inputs: {_names(spec.inputs)})", node, field)
        elif ref.node not in spec.nodes:
            issue(f"references unknown node '{ref.node}'", node, field)
        elif ref.node in signatures:
            outs = _names(signatures[ref.node].outputs)
            issue(f"node '{ref.node}' has no output '{ref.tensor}' (outputs: {outs})", node, field)
        return False

    dag = nx.DiGraph()
    dag.add_nodes_from(spec.nodes)
    used: set[str] = set()
    for node in spec.nodes.values():
        if node.name not in signatures:
            continue
        sig = signatures[node.name]
        if sig.inputs is not None:
            for missing in sorted(set(sig.inputs) - set(node.inputs) - sig.optional):
                issue(f"required input '{missing}' is not wired", node.name, f"inputs.{missing}")
        for in_name, binding in node.inputs.items():
            field = f"inputs.{in_name}"
            if sig.inputs is not None and in_name not in sig.inputs:
                issue(
                    f"'{node.target or node.kind}' has no input '{in_name}' (inputs: {_names(sig.inputs)})",
                    node.name,
                    field,
                )
                continue
            want = sig.inputs.get(in_name) if sig.inputs is not None else None
            for ref in binding:
                if not check_ref(ref, node.name, field):
                    continue
                used.add(ref.key)
                if ref.node is not None:
                    dag.add_edge(ref.node, node.name)
                _check_edge(known[ref.key], want, ref, issue, node.name, field)

    outputs: list[PlanOutput] = []
    for gout in spec.outputs.values():
        field = f"outputs.{gout.name}"
        producers = [known[r.key] for r in gout.source if check_ref(r, None, field)]
        used.update(r.key for r in gout.source)
        tensor = _output_type(gout, producers, spec.max_batch_size)
        if tensor is None:
            if len(producers) == len(gout.source):
                issue(
                    "datatype or dims unknown: declare them on the graph output or on the producing node",
                    None,
                    field,
                )
            continue
        outputs.append(PlanOutput(gout.name, tuple(r.key for r in gout.source), tensor))

    try:
        cycle = nx.find_cycle(dag)
        path = " -> ".join([*(u for u, _ in cycle), cycle[0][0]])
        issue(f"cycle: {path}", cycle[0][0], "inputs")
    except nx.NetworkXNoCycle:
        pass
    for name in spec.inputs:
        if f"${name}" not in used:
            issue(f"graph input '{name}' is used by no node and no output", None, f"inputs.{name}")
    for name, sig in signatures.items():
        if sig.outputs and not any(f"{name}.{o}" in used for o in sig.outputs):
            issue(f"no node or graph output uses any output of node '{name}'", name, "outputs")

    if issues:
        raise SpecError(issues)
    return _build(spec, dag, signatures, inputs, outputs)


def _output_type(
    out: GraphOutput, producers: list[TensorSpec | None], max_batch_size: int
) -> TensorSpec | None:
    """A graph output's type: as declared (dims without the batch dim, like inputs), else the
    first typed producer's."""
    produced = next((t for t in producers if t is not None), None)
    datatype = out.datatype or (produced.datatype if produced else None)
    if out.dims is not None:
        dims: tuple[int, ...] | None = TensorSpec("", "", out.dims).full_shape(max_batch_size)
    else:
        dims = produced.dims if produced else None
    if datatype is None or dims is None:
        return None
    return TensorSpec(out.name, datatype, dims)


def _type_switch_branches(
    spec: GraphSpec, signatures: dict[str, Signature], known: dict[str, TensorSpec | None]
) -> None:
    """A switch branch carries its payload, so it has the payload's type (switches may chain)."""
    switches = [n for n in spec.nodes.values() if n.switch is not None and n.name in signatures]
    for _ in range(len(switches)):
        changed = False
        for node in switches:
            assert node.switch is not None
            payload = known.get(node.switch.payload.key)
            for branch in node.switch.branches:
                key = f"{node.name}.{branch}"
                if payload is not None and known.get(key) is None:
                    known[key] = payload
                    signatures[node.name].outputs[branch] = payload
                    changed = True
        if not changed:
            return


def _check_edge(
    have: TensorSpec | None,
    want: TensorSpec | None,
    ref: Ref,
    issue: Callable[[str, str | None, str | None], None],
    node: str,
    field: str,
) -> None:
    if have is None or want is None:
        return
    if have.datatype != want.datatype:
        issue(
            f"datatype mismatch: '{ref.key}' is {have.datatype} but the input expects {want.datatype}",
            node,
            field,
        )
    elif not shapes_compatible(have.dims, want.dims):
        issue(
            f"shape mismatch: '{ref.key}' has shape {list(have.dims)} "
            f"but the input expects {list(want.dims)}",
            node,
            field,
        )


def _build(
    spec: GraphSpec,
    dag: nx.DiGraph,
    signatures: dict[str, Signature],
    inputs: dict[str, TensorSpec],
    outputs: list[PlanOutput],
) -> Plan:
    order = list(nx.lexicographical_topological_sort(dag, key=list(spec.nodes).index))
    index = {name: i for i, name in enumerate(order)}
    nodes = []
    consumers: dict[str, list[int]] = {}
    for name in order:
        node = spec.nodes[name]
        sig = signatures[name]
        bindings = tuple((k, tuple(r.key for r in b)) for k, b in node.inputs.items())
        for _, keys in bindings:
            for key in keys:
                consumers.setdefault(key, []).append(index[name])
        nodes.append(
            PlanNode(
                index=index[name],
                name=name,
                spec=node,
                bindings=bindings,
                outputs=tuple(sig.outputs),
                optional=sig.optional,
                signature=sig,
            )
        )
    output_keys: dict[str, list[str]] = {}
    for out in outputs:
        for key in out.keys:
            output_keys.setdefault(key, []).append(out.name)
    return Plan(
        spec=spec,
        nodes=tuple(nodes),
        inputs=inputs,
        outputs=tuple(outputs),
        consumers={k: tuple(dict.fromkeys(v)) for k, v in consumers.items()},
        output_keys={k: tuple(v) for k, v in output_keys.items()},
    )


def _names(items: object) -> str:
    names = list(items) if isinstance(items, dict) else []
    return ", ".join(str(n) for n in names) or "none"
