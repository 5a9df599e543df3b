"""Node kinds: everything declarative about a kind, one :class:`Kind` object per kind, all
registered in :data:`KINDS` (the one table of kinds; nothing else compares kind strings).

A kind says how its YAML key parses into a :class:`NodeSpec`, what loading must know about
it (does it call another servable, may it batch) and how a drawing labels and shapes it. It
is plain data and pure functions, so every layer may read it: YAML parsing here in
``spec/``, compiling and the drawable view in ``graph/``, the node factory in ``nodes/``,
rendering in ``observability/``. What a kind does at run time (its node object, its signature)
is the business of ``nodes/``, which cannot live this low: ``flowserve/nodes/kinds.py`` holds
one :class:`~flowserve.nodes.kinds.Builder` per kind and refuses to import while a kind here
has none. The executor knows no kinds at all: it reads the node contract's flags
(``Node.decoupled``, ``Node.partial_outputs``) on the node objects.

**Adding a node kind**: add its ``Kind`` to :data:`KINDS` below (its YAML key, parser, flags,
look), then its ``Builder`` to ``BUILDERS`` in ``flowserve/nodes/kinds.py``. Nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from flowserve.core.errors import SpecIssue
from flowserve.spec.bounds import BOUNDS
from flowserve.spec.schema import (
    STICKY_INPUT,
    Binding,
    ModelSpec,
    NodeSpec,
    Ref,
    ShadowSpec,
    SplitArm,
    SplitSpec,
    SplitTarget,
    SwitchCase,
    SwitchSpec,
)
from flowserve.spec.suggest import closest, did_you_mean

_SWITCH_OPS = {"eq", "ne", "gt", "ge", "lt", "le"}


class Issues:
    """The problems found while parsing one file (each names the file, node and field)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[SpecIssue] = []

    def add(self, message: str, node: str | None = None, field: str | None = None) -> None:
        self.items.append(SpecIssue(self.file, message, node, field))


def unknown_keys(
    raw: dict[Any, Any], allowed: Iterable[str], issues: Issues, node: str | None, field: str | None
) -> set[str]:
    """Report the keys of ``raw`` that are not ``allowed`` with the allowed key each most looks
    like ("did you mean"), else the list of allowed keys: one issue per key whose field is the
    key itself when ``field`` is None (a graph's or node's own keys), else one issue at
    ``field``. Returns the absent allowed keys that a misspelled one was meant to be, so that
    their absence is not told once more."""
    allowed = list(allowed)
    absent = [k for k in allowed if k not in raw]
    unknown = sorted(str(k) for k in raw if k not in allowed)
    meant = {key: best[0] for key in unknown if (best := closest(key, absent))}
    expected = f"expected one of {', '.join(sorted(allowed))}"
    if field is None:
        for key in unknown:
            hint = f"did you mean '{meant[key]}'?" if key in meant else expected
            issues.add(f"unknown key ({hint})", node, key)
    elif unknown:
        hints = [f"did you mean {', '.join(repr(v) for v in meant.values())}?"] if meant else []
        hints += [expected] if len(meant) < len(unknown) else []
        issues.add(f"unknown keys {unknown} ({'; '.join(hints)})", node, field)
    return set(meant.values())


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


# ----------------------------------------------------------------------------- the kind object


@dataclass(frozen=True, slots=True)
class Parsed:
    """What a kind's YAML value sets on its node: ``inputs`` are the node's inputs after the
    kind had its say (a switch's come from its own settings, a split adds its sticky key)."""

    inputs: dict[str, Binding]
    target: str = ""
    switch: SwitchSpec | None = None
    split: SplitSpec | None = None
    # the version the kind's own value names (a remote node's ``version``); "" leaves the
    # node's ``version:`` key in charge
    version: str = ""


# (the kind key's YAML value, the node's parsed ``inputs:``, issues, node name) -> fields, or
# None when the node cannot be made at all
Parser = Callable[[Any, dict[str, Binding], Issues, str], "Parsed | None"]
# (node, the repository model it runs when ``runs_model``) -> the drawing's first label lines
Label = Callable[[NodeSpec, "ModelSpec | None"], list[str]]


@dataclass(frozen=True, slots=True)
class Look:
    """How a drawing shows the kind: fill colour (None: the neutral grey) and shape
    ("hexagon": a DOT hexagon, a Mermaid ``{{ }}``, a rounder, red-edged box in the built-in SVG)."""

    color: str | None = None
    shape: Literal["box", "hexagon"] = "box"


def _target_label(node: NodeSpec, model: ModelSpec | None) -> list[str]:
    version = f" v{node.version}" if node.version else ""
    runs = f" ({model.platform or model.backend})" if model is not None else ""
    return [f"{node.kind}: {node.target}{version}{runs}"]


@dataclass(frozen=True, slots=True)
class Kind:
    """One node kind. ``parse`` is None for a kind never written in YAML (``backend``, the
    one node of a repository model's own graph)."""

    name: str
    parse: Parser | None
    # calls the servable ``target`` names (a model or graph step): a dependency at load
    step: bool = False
    # ``target`` names a repository model whose platform, batching and instances drawings show
    runs_model: bool = False
    # why ``batching:`` is refused on this kind ("" when it may batch)
    no_batching: str = ""
    # batches as its repository model's config says (``dynamic_batching``), not by ``batching:``
    model_batching: bool = False
    look: Look = field(default_factory=Look)
    label: Label = _target_label


# ----------------------------------------------------------------------------- YAML parsers


def _target_parser(kind: str, check: Callable[[str, Issues, str], None] | None = None) -> Parser:
    def parse(raw: Any, inputs: dict[str, Binding], issues: Issues, node: str) -> Parsed | None:
        if not isinstance(raw, str) or not raw:
            issues.add("must name a target", node, kind)
            return None
        if check is not None:
            check(raw, issues, node)
        return Parsed(inputs, target=raw)

    return parse


def _python_target(target: str, issues: Issues, node: str) -> None:
    if ":" not in target:
        issues.add(f"must be 'module:Class', got {target!r}", node, "python")


def _switch_node(raw: Any, inputs: dict[str, Binding], issues: Issues, node: str) -> Parsed | None:
    switch = _parse_switch(raw, issues, node)
    if switch is not None:
        inputs = {"on": (switch.on,), "payload": (switch.payload,)}
    return Parsed(inputs, switch=switch)


def _split_node(raw: Any, inputs: dict[str, Binding], issues: Issues, node: str) -> Parsed | None:
    split = _parse_split(raw, issues, node)
    if split is None:
        return None
    if split.sticky is not None:
        inputs = {**inputs, STICKY_INPUT: (split.sticky,)}
    return Parsed(inputs, split=split)


def _parse_switch(raw: Any, issues: Issues, node: str) -> SwitchSpec | None:
    if not isinstance(raw, dict):
        issues.add("must be a mapping with input, cases and optional payload/default", node, "switch")
        return None
    meant = unknown_keys(raw, ("input", "payload", "cases", "default"), issues, node, "switch")
    on = parse_ref(raw.get("input"))
    if on is None and "input" in meant:
        return None
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
            hint = did_you_mean(str(op), _SWITCH_OPS)
            issues.add(f"op must be one of {sorted(_SWITCH_OPS)}, got {op!r}{hint}", node, f"{field}.op")
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


def _parse_target(raw: Any, issues: Issues, node: str, field: str, extra: set[str]) -> SplitTarget | None:
    """``{model: name, version: 2}`` or ``{graph: name}`` (plus the ``extra`` keys allowed)."""
    if not isinstance(raw, dict):
        issues.add("must be a mapping with 'model' (and maybe 'version') or 'graph'", node, field)
        return None
    meant = unknown_keys(raw, ("model", "graph", "version", *extra), issues, node, field)
    kinds = [k for k in ("model", "graph") if k in raw]
    if not kinds and meant & {"model", "graph"}:
        return None
    if len(kinds) != 1 or not isinstance(raw[kinds[0]], str) or not raw[kinds[0]]:
        issues.add("needs exactly one of 'model: NAME' or 'graph: NAME'", node, field)
        return None
    kind: Literal["model", "graph"] = "model" if kinds[0] == "model" else "graph"
    version = raw.get("version", "")
    if kind == "graph" and version not in ("", None):
        issues.add("a graph has no versions", node, f"{field}.version")
    return SplitTarget(kind, raw[kind], str(version) if kind == "model" and version is not None else "")


def _number(raw: Any, issues: Issues, node: str, field: str, low: float, high: float | None) -> float | None:
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


def _bounded_number(raw: Any, key: str, issues: Issues, node: str, field: str) -> float | None:
    """A number within its bound (spec/bounds.py), else None with the problem told."""
    bound = BOUNDS[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not bound.holds(raw):
        issues.add(
            f"must be a number between {bound.low} and {bound.high} ({bound.what}), got {raw!r}", node, field
        )
        return None
    return float(raw)


def _in_flight(raw: Any, issues: Issues, node: str, field: str) -> int:
    """A ``max_in_flight`` setting (64 stands in for a bad one, which is told)."""
    bound = BOUNDS["max_in_flight"]
    if isinstance(raw, bool) or not isinstance(raw, int) or not bound.holds(raw):
        issues.add(
            f"must be an integer between {bound.low} and {bound.high} ({bound.what}), got {raw!r}",
            node,
            field,
        )
        return 64
    return raw


def _parse_split(raw: Any, issues: Issues, node: str) -> SplitSpec | None:
    keys = {"arms", "by_parameter", "sticky", "sticky_parameter", "shadow"}
    if not isinstance(raw, dict):
        issues.add(f"must be a mapping with keys {sorted(keys)}", node, "split")
        return None
    before = len(issues.items)
    meant = unknown_keys(raw, keys, issues, node, "split")
    raw_arms = raw.get("arms")
    arms: list[SplitArm] = []
    if not isinstance(raw_arms, dict) or not raw_arms:
        if "arms" not in meant:
            issues.add(
                "must be a non-empty mapping of arm name to {model|graph, version, weight}",
                node,
                "split.arms",
            )
    else:
        for arm_name, arm in raw_arms.items():
            field = f"split.arms.{arm_name}"
            target = _parse_target(arm, issues, node, field, {"weight"})
            weight = (
                _bounded_number(arm.get("weight", 1), "weight", issues, node, f"{field}.weight")
                if target
                else None
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
            limit = _in_flight(
                shadow_raw.get("max_in_flight", 64), issues, node, "split.shadow.max_in_flight"
            )
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


# ----------------------------------------------------------------------------- remote nodes

_REMOTE_SCHEMES = ("grpc", "http")
_REMOTE_KEYS = {"url", "urls", "model", "version", "max_in_flight", "timeout_s"}


@dataclass(frozen=True, slots=True)
class RemoteSpec:
    """A model on another KServe V2 server (flowserve or Triton) that a ``remote`` node calls:
    its endpoints (``grpc://host:port`` or ``http://host:port``, all serving the same model),
    the model and version, how many calls one endpoint may have in flight, and ``timeout_s``:
    how long the load-time metadata query and the health probes may take."""

    urls: tuple[str, ...]
    model: str
    version: str = ""
    max_in_flight: int = 64
    timeout_s: float = 5.0

    def where(self) -> str:
        version = f" version {self.version}" if self.version else ""
        return f"remote model '{self.model}'{version} at {', '.join(self.urls)}"


def remote_target(remote: RemoteSpec) -> str:
    """A remote node's ``target``: ``model@url1,url2?max_in_flight=N&timeout_s=T`` (NodeSpec
    has no field of its own for it; :func:`remote_spec` reads it back)."""
    options = f"max_in_flight={remote.max_in_flight}&timeout_s={remote.timeout_s:g}"
    return f"{remote.model}@{','.join(remote.urls)}?{options}"


def remote_spec(node: NodeSpec) -> RemoteSpec:
    """The :class:`RemoteSpec` of a ``remote`` node (the inverse of :func:`remote_target`)."""
    head, _, query = node.target.partition("?")
    model, _, urls = head.rpartition("@")
    options = dict(item.partition("=")[::2] for item in query.split("&") if item)
    return RemoteSpec(
        urls=tuple(urls.split(",")),
        model=model,
        version=node.version,
        max_in_flight=int(options.get("max_in_flight", 64)),
        timeout_s=float(options.get("timeout_s", 5.0)),
    )


def _remote_url(raw: Any, issues: Issues, node: str, field: str) -> str | None:
    if not isinstance(raw, str):
        issues.add(f"must be a 'grpc://host:port' or 'http://host:port' URL, got {raw!r}", node, field)
        return None
    scheme, sep, address = raw.partition("://")
    host, colon, port = address.rstrip("/").rpartition(":")
    if not sep or scheme not in _REMOTE_SCHEMES or not colon or not host or not port.isdigit():
        issues.add(f"must be a 'grpc://host:port' or 'http://host:port' URL, got {raw!r}", node, field)
        return None
    if any(c in address for c in ",?@&"):
        issues.add(f"unexpected characters in {raw!r}", node, field)
        return None
    return f"{scheme}://{address.rstrip('/')}"


def _remote_node(raw: Any, inputs: dict[str, Binding], issues: Issues, node: str) -> Parsed | None:
    if not isinstance(raw, dict):
        issues.add("must be a mapping with url (or urls), model and optional version", node, "remote")
        return None
    before = len(issues.items)
    meant = unknown_keys(raw, _REMOTE_KEYS, issues, node, "remote")
    if "url" not in raw and "urls" not in raw and meant & {"url", "urls"}:
        return None
    if ("url" in raw) == ("urls" in raw):
        issues.add("needs exactly one of 'url: URL' or 'urls: [URL, ...]'", node, "remote")
        return None
    if "url" in raw:
        raw_urls: Any = [raw["url"]]
        field = "remote.url"
    else:
        raw_urls = raw["urls"]
        field = "remote.urls"
        if not isinstance(raw_urls, list) or not raw_urls:
            issues.add("must be a non-empty list of URLs", node, field)
            return None
    urls = [_remote_url(u, issues, node, field) for u in raw_urls]
    model = raw.get("model")
    if not isinstance(model, str) or not model or any(c in model for c in "@?,"):
        issues.add(f"must name the remote model, got {model!r}", node, "remote.model")
    version = raw.get("version", "")
    if (
        isinstance(version, bool)
        or not isinstance(version, str | int)
        or (isinstance(version, int) and version < 1)
    ):
        issues.add(f"must be a version number, got {version!r}", node, "remote.version")
    limit = _in_flight(raw.get("max_in_flight", 64), issues, node, "remote.max_in_flight")
    timeout = _bounded_number(raw.get("timeout_s", 5.0), "timeout_s", issues, node, "remote.timeout_s")
    if len(issues.items) > before or timeout is None:
        return None
    remote = RemoteSpec(
        tuple(dict.fromkeys(u for u in urls if u is not None)), str(model), str(version), limit, timeout
    )
    return Parsed(inputs, target=remote_target(remote), version=remote.version)


# ----------------------------------------------------------------------------- labels


def case_text(switch: SwitchSpec, branch: str) -> str:
    """When ``branch`` is taken, in words ("x gt 100 (any)", "default", "never")."""
    on = switch.on.key.removeprefix("$")
    conds = [f"{on} {c.op} {c.value!r} ({c.reduce})" for c in switch.cases if c.branch == branch]
    if conds:
        return " or ".join(conds)
    return "default" if branch == switch.default else "never"


def _switch_label(node: NodeSpec, model: ModelSpec | None) -> list[str]:
    if node.switch is None:
        return _target_label(node, model)
    return ["switch", *(f"{b}: {case_text(node.switch, b)}" for b in node.switch.branches)]


def _split_label(node: NodeSpec, model: ModelSpec | None) -> list[str]:
    if node.split is None:
        return _target_label(node, model)
    lines = ["split", *(f"{a.name} ({a.weight:g}): {a.target}" for a in node.split.arms)]
    if node.split.shadow is not None:
        lines.append(f"shadow: {node.split.shadow.target}")
    return lines


def _remote_label(node: NodeSpec, model: ModelSpec | None) -> list[str]:
    remote = remote_spec(node)
    version = f" v{remote.version}" if remote.version else ""
    return [f"remote: {remote.model}{version}", *(f"@ {url}" for url in remote.urls)]


def _backend_label(node: NodeSpec, model: ModelSpec | None) -> list[str]:
    backend = model.platform or model.backend if model is not None else ""
    return [f"backend: {backend}" if backend else "backend"]


# ----------------------------------------------------------------------------- the registry


def _register(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


KINDS: dict[str, Kind] = _register(
    Kind(
        "model",
        _target_parser("model"),
        step=True,
        runs_model=True,
        look=Look("#dcfce7"),
    ),
    Kind("python", _target_parser("python", _python_target), look=Look("#fef3c7")),
    Kind(
        "switch",
        _switch_node,
        no_batching="a switch node cannot batch (its rows would take different branches)",
        look=Look("#fce7f3", "hexagon"),
        label=_switch_label,
    ),
    Kind("graph", _target_parser("graph"), step=True, look=Look("#e0e7ff")),
    Kind(
        "split",
        _split_node,
        no_batching="a split node cannot batch (a merged batch would take one arm); batch in its arms",
        label=_split_label,
    ),
    # a model on another V2 server (flowserve or Triton), called over gRPC or HTTP
    Kind("remote", _remote_node, look=Look("#e0f2fe"), label=_remote_label),
    # internal: the one node of a repository model's own graph, running the model's backend
    Kind("backend", None, runs_model=True, model_batching=True, look=Look("#dcfce7"), label=_backend_label),
)

# the kind keys of a YAML node, in the order error messages list them
YAML_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.parse is not None)


def kind_of(node: NodeSpec) -> Kind:
    return KINDS[node.kind]


def node_targets(node: NodeSpec, shadow: bool = True) -> tuple[str, ...]:
    """The servables a node calls: a model or graph step's target, a split's arms and (unless
    ``shadow`` is false: a shadow never makes a graph unready) its shadow."""
    if kind_of(node).step:
        return (node.target,)
    if node.split is not None:
        names = [a.target.target for a in node.split.arms]
        if shadow and node.split.shadow is not None:
            names.append(node.split.shadow.target.target)
        return tuple(dict.fromkeys(names))
    return ()


__all__ = [
    "KINDS",
    "YAML_KINDS",
    "Issues",
    "Kind",
    "Look",
    "Parsed",
    "RemoteSpec",
    "case_text",
    "kind_of",
    "node_targets",
    "parse_ref",
    "remote_spec",
    "remote_target",
    "unknown_keys",
]
