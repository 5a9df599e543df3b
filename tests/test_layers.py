"""The layering of DESIGN.md, checked on every module of flowserve/ by reading its imports.

cli, server, settings, cluster (and the package root)  ->  frontends/http, frontends/grpc, observability
->  dataplane  ->  repository  ->  nodes  ->  runtime  ->  graph  ->  spec  ->  core; a layer never
imports a higher one, the three translators never import each other (the front ends share only ``flowserve/frontends/__init__.py``),
only ``flowserve/frontends/`` imports grpc or the HTTP stack, and only ``flowserve/nodes/backends/``
imports an ML framework, and only inside a function, so a missing framework never breaks a load.

Written with ``ast`` rather than import-linter: the rules are by package prefix (they hold however
modules move inside a layer), the lazy-import rule needs to know *where* in a module an import sits
(import-linter sees the graph, not function bodies), and the frameworks it forbids need not be
installed to be checked. Module-level and function-level ``import``/``from ... import`` (relative
ones resolved) and ``importlib.import_module("literal")`` are read; imports under
``if TYPE_CHECKING:`` count for the layering but not as eager framework imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flowserve"

# higher numbers may import lower (and equal, within one layer); the translators share rank 7
RANKS = {
    "core": 0,
    "spec": 1,
    "graph": 2,
    "runtime": 3,
    "nodes": 4,
    "repository": 5,
    "dataplane": 6,
    "frontends": 7,  # flowserve/frontends/__init__.py: names shared by both front ends
    "frontends.http": 7,
    "frontends.grpc": 7,
    "frontends.openai": 7,
    "observability": 7,
    "cli": 8,
    "server": 8,
    "cluster": 8,  # the workers of one server (--workers N) and their supervisor
    "settings": 8,
    "scaffold": 8,  # flowserve init: the files of a new project (it imports nothing of flowserve)
    "bench": 8,  # flowserve bench: a load generator, a client of the server (tools, like cli)
    "analyze": 8,  # flowserve analyze: starts servers and measures them with bench
    "": 8,  # flowserve/__init__.py: the public surface re-exports the engine
}
TRANSLATORS = ("frontends.http", "frontends.grpc", "frontends.openai", "observability")

# only flowserve/frontends/ speaks a wire protocol
TRANSPORT = {"grpc", "grpc_health", "grpc_reflection", "uvicorn", "httptools", "hpack", "h2", "h11"}
TRANSPORT |= {"starlette", "fastapi", "aiohttp", "granian", "hypercorn", "websockets"}
TRANSPORT_OWNER = "flowserve.frontends"

# only flowserve/nodes/backends/ runs a model framework, and lazily
FRAMEWORKS = {"onnxruntime", "onnx", "torch", "torchvision", "tensorrt", "tensorrt_lean", "nvidia"}
FRAMEWORKS |= {"treelite", "tl2cgen", "xgboost", "lightgbm", "sklearn", "openvino", "tensorflow"}
FRAMEWORKS |= {"cuml", "nvforest", "cupy", "pycuda", "jax", "paddle", "keras", "tritonserver"}
FRAMEWORKS_OWNER = "flowserve.nodes.backends"

# (importing module, imported module) pairs that break a rule today, each with the reason it stays;
# (the load generator's gRPC client is no front end of the server)
ALLOWED: dict[tuple[str, str], str] = {
    ("flowserve.bench.grpc_client", "grpc"): "the load generator is a gRPC client, not a front end",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted and absolute
    line: int
    lazy: bool  # inside a function body or an ``if TYPE_CHECKING:`` block


def _module_name(path: Path) -> tuple[str, str]:
    """The dotted name of a source file and the package its relative imports start from."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, source: str | None = None) -> list[Import]:
    module, package = _module_name(path)
    found: list[Import] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        return ".".join([*base, node.module] if node.module else base)

    def walk(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            inner = inner or (isinstance(child, ast.If) and _is_type_checking(child))
            if isinstance(child, ast.Import):
                found.extend(Import(module, alias.name, child.lineno, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = resolve(child)
                found.append(Import(module, target, child.lineno, lazy))
                # ``from flowserve.frontends import http`` imports the subpackage
                found.extend(
                    Import(module, f"{target}.{alias.name}", child.lineno, lazy)
                    for alias in child.names
                    if (PACKAGE.parent / Path(*f"{target}.{alias.name}".split("."))).is_dir()
                )
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute | ast.Name)
                and (child.func.attr if isinstance(child.func, ast.Attribute) else child.func.id)
                in ("import_module", "__import__")
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                found.append(Import(module, child.args[0].value, child.lineno, lazy))
            walk(child, inner)

    text = path.read_text() if source is None else source
    walk(ast.parse(text, filename=str(path)), lazy=False)
    return found


def _all_imports() -> list[Import]:
    return [found for path in sorted(PACKAGE.rglob("*.py")) for found in _imports(path)]


IMPORTS = _all_imports()


def _layer(module: str) -> str:
    """The layer a dotted flowserve module belongs to (a key of RANKS)."""
    parts = module.split(".")[1:]
    if not parts:
        return ""
    if parts[0] == "frontends" and len(parts) > 1:
        return f"frontends.{parts[1]}"
    if parts[0] not in RANKS:
        raise AssertionError(f"{module}: flowserve/{parts[0]} is in no layer of DESIGN.md; add it to RANKS")
    return parts[0]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _top(target: str) -> str:
    return target.split(".")[0]


def _where(found: Import) -> str:
    return f"{found.module}:{found.line} imports {found.target}"


def _layer_violation(found: Import) -> str | None:
    source, target = _layer(found.module), _layer(found.target)
    if source == target:
        return None
    if RANKS[target] > RANKS[source]:
        return f"{_where(found)}: {source or 'flowserve'} may not import the higher layer {target}"
    if RANKS[target] == RANKS[source] == RANKS["frontends"]:
        if target == "frontends" and source.startswith("frontends."):
            return None  # the front ends' shared names
        return f"{_where(found)}: the translators {source} and {target} never import each other"
    return None


def test_the_scan_sees_every_kind_of_import() -> None:
    """Guards the scanner itself: module-level, relative, function-level and import_module imports."""
    modules = {found.module for found in IMPORTS}
    assert {"flowserve.core.errors", "flowserve.dataplane.engine", "flowserve.cli"} <= modules
    assert any(not f.lazy and _within(f.target, "flowserve.core") for f in IMPORTS)
    lazy_frameworks = [f for f in IMPORTS if f.lazy and _top(f.target) in FRAMEWORKS]
    assert lazy_frameworks, "no lazy framework import seen: the scan misses function bodies"


def test_relative_lazy_and_dynamic_imports_are_read() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import base\n"
        "from ...core import errors\n"
        "if TYPE_CHECKING:\n"
        "    import tensorflow\n"
        "def load():\n"
        "    import torch\n"
        "    return importlib.import_module('openvino')\n"
        "import onnxruntime\n"
    )
    found = _imports(PACKAGE / "nodes" / "backends" / "probe.py", source)
    assert {(f.module, f.target, f.lazy) for f in found} == {
        ("flowserve.nodes.backends.probe", "typing", False),
        ("flowserve.nodes.backends.probe", "flowserve.nodes.backends", False),
        ("flowserve.nodes.backends.probe", "flowserve.core", False),
        ("flowserve.nodes.backends.probe", "tensorflow", True),
        ("flowserve.nodes.backends.probe", "torch", True),
        ("flowserve.nodes.backends.probe", "openvino", True),
        ("flowserve.nodes.backends.probe", "onnxruntime", False),
    }
    assert _layer("flowserve.frontends.grpc.service") == "frontends.grpc"
    assert _layer("flowserve.frontends") == "frontends"
    assert _layer("flowserve") == ""


def test_no_layer_imports_a_higher_one_and_translators_stay_apart() -> None:
    violations = [
        message
        for found in IMPORTS
        if _within(found.target, "flowserve")
        and (message := _layer_violation(found)) is not None
        and (found.module, found.target) not in ALLOWED
    ]
    assert not violations, "\n".join(violations)


def test_only_the_front_ends_import_a_transport() -> None:
    violations = [
        f"{_where(found)}: only flowserve/frontends/ imports grpc or the HTTP stack"
        for found in IMPORTS
        if _top(found.target) in TRANSPORT
        and not _within(found.module, TRANSPORT_OWNER)
        and (found.module, found.target) not in ALLOWED
    ]
    assert not violations, "\n".join(violations)


def test_only_backends_import_a_framework_and_only_lazily() -> None:
    violations = [
        f"{_where(found)}: "
        + (
            "a framework is imported inside a function (lazily), so a missing one never breaks a load"
            if _within(found.module, FRAMEWORKS_OWNER)
            else "only flowserve/nodes/backends/ imports an ML framework"
        )
        for found in IMPORTS
        if _top(found.target) in FRAMEWORKS
        and (found.lazy is False or not _within(found.module, FRAMEWORKS_OWNER))
        and (found.module, found.target) not in ALLOWED
    ]
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize(
    ("module", "target", "broken"),
    [
        ("flowserve.core.errors", "flowserve.dataplane.engine", True),
        ("flowserve.graph.view", "flowserve.observability.ui", True),
        ("flowserve.observability.ui", "flowserve.graph.view", False),
        ("flowserve.frontends.http.app", "flowserve.frontends.grpc.codec", True),
        ("flowserve.frontends.grpc.service", "flowserve.observability.metrics", True),
        ("flowserve.observability.metrics", "flowserve.frontends.http.app", True),
        ("flowserve.frontends.grpc.service", "flowserve.frontends", False),
        ("flowserve.observability.metrics", "flowserve.frontends", True),
        ("flowserve.server", "flowserve.frontends.grpc", False),
        ("flowserve.dataplane.plane", "flowserve", True),
    ],
)
def test_the_layer_rule(module: str, target: str, broken: bool) -> None:
    assert (_layer_violation(Import(module, target, 1, lazy=False)) is not None) is broken
