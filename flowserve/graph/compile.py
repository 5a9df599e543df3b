"""GraphSpec -> Plan, validated once at load.

Checks: every reference names a graph input or an existing node output; node inputs match
what the node accepts; datatypes and shapes agree along every edge; the graph is acyclic
(the cycle is printed); every node's outputs and every graph input are used; every graph
output is produced and typed. All problems are returned together, each naming file, node and
field; a misspelled name gets a "did you mean" and is one error, not a cascade of follow-ups
(what it leaves unwired or unused is not reported again). Node signatures come from an injected
resolver, so this module imports no node kind.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx

from flowserve.core.errors import FlowserveError, SpecError, SpecIssue
from flowserve.graph.plan import Plan, PlanNode, PlanOutput, Signature
from flowserve.spec.schema import GraphOutput, GraphSpec, NodeSpec, Ref, TensorSpec
from flowserve.spec.suggest import closest, did_you_mean

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
            hint = did_you_mean(ref.tensor, spec.inputs, "$")
            issue(f"graph has no input '{ref.tensor}'{hint} (inputs: {_names(spec.inputs)})", node, field)
        elif ref.node not in spec.nodes:
            issue(f"references unknown node '{ref.node}'{did_you_mean(ref.node, spec.nodes)}", node, field)
        elif ref.node in signatures:
            outs = signatures[ref.node].outputs
            hint = did_you_mean(ref.tensor, outs)
            issue(
                f"node '{ref.node}' has no output '{ref.tensor}'{hint} (outputs: {_names(outs)})", node, field
            )
        # a node whose signature failed is already reported: nothing more about it here
        return False

    dag = nx.DiGraph()
    dag.add_nodes_from(spec.nodes)
    for node in spec.nodes.values():
        if node.name not in signatures:
            continue
        sig = signatures[node.name]
        wired = _check_wiring(node, sig, issue)
        for in_name in wired:
            field = f"inputs.{in_name}"
            want = sig.inputs.get(in_name) if sig.inputs is not None else None
            for ref in node.inputs[in_name]:
                if not check_ref(ref, node.name, field):
                    continue
                if ref.node is not None:
                    dag.add_edge(ref.node, node.name)
                _check_edge(known[ref.key], want, ref, issue, node.name, field)

    outputs: list[PlanOutput] = []
    for gout in spec.outputs.values():
        field = f"outputs.{gout.name}"
        producers = [known[r.key] for r in gout.source if check_ref(r, None, field)]
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
    # used means named by some reference, even a broken one (that one is reported already): a
    # typo is one error, not one more for each thing it leaves unused
    refs = [r for n in spec.nodes.values() for b in n.inputs.values() for r in b]
    refs += [r for o in spec.outputs.values() for r in o.source]
    used_inputs = {r.tensor for r in refs if r.node is None}
    used_nodes = {r.node for r in refs if r.node is not None}
    # and a misspelled name (reported with its 'did you mean') counts for the name it was meant to be
    used_inputs.update(*(closest(n, spec.inputs) for n in used_inputs - set(spec.inputs)))
    used_nodes.update(*(closest(n, spec.nodes) for n in used_nodes - set(spec.nodes)))
    for name in spec.inputs:
        if name not in used_inputs:
            issue(f"graph input '{name}' is used by no node and no output", None, f"inputs.{name}")
    for name, sig in signatures.items():
        if sig.outputs and name not in used_nodes:
            issue(f"no node or graph output uses any output of node '{name}'", name, "outputs")

    if issues:
        raise SpecError(issues)
    return _build(spec, dag, signatures, inputs, outputs)


def _check_wiring(
    node: NodeSpec, sig: Signature, issue: Callable[[str, str | None, str | None], None]
) -> list[str]:
    """Report the node's inputs that its target does not have and the required ones not wired;
    returns the wired inputs that exist. A misspelled input is one error: the required input it
    was meant to be is not reported missing as well."""
    if sig.inputs is None:
        return list(node.inputs)
    missing = set(sig.inputs) - set(node.inputs) - sig.optional
    free = [n for n in sig.inputs if n not in node.inputs]
    for in_name in node.inputs:
        if in_name in sig.inputs:
            continue
        meant = closest(in_name, free)
        hint = f" (did you mean '{meant[0]}'?)" if meant else ""
        missing.difference_update(meant)
        issue(
            f"'{node.target or node.kind}' has no input '{in_name}'{hint} (inputs: {_names(sig.inputs)})",
            node.name,
            f"inputs.{in_name}",
        )
    for name in sorted(missing):
        issue(f"required input '{name}' is not wired", node.name, f"inputs.{name}")
    return [n for n in node.inputs if n in sig.inputs]


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
