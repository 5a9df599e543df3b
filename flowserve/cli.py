"""``flowserve serve | validate | graph list | graph render``."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flowserve.core.errors import InvalidArgument, SpecIssue
from flowserve.frontends import GRPC_SERVERS, HTTP_SERVERS
from flowserve.nodes.factory import compile_all
from flowserve.repository.repository import add_import_roots, scan_all
from flowserve.repository.settings import RepositorySettings
from flowserve.settings import Settings

if TYPE_CHECKING:
    from flowserve.frontends.grpc.tls import GrpcTls
    from flowserve.nodes.ratelimit import ResourceLimit
    from flowserve.observability.traceconfig import TraceConfig
    from flowserve.repository.remote import RemoteOptions

DEFAULT_REPOSITORY = "model_repository"
DEFAULT_GRAPHS = "graphs"


def _sources(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    repos = [Path(p) for p in (args.model_repository or [])]
    graphs = [Path(p) for p in (args.graphs or [])]
    if not repos and not graphs:
        repos = [Path(DEFAULT_REPOSITORY)] if Path(DEFAULT_REPOSITORY).is_dir() else []
        graphs = [Path(DEFAULT_GRAPHS)] if Path(DEFAULT_GRAPHS).is_dir() else []
    return repos, graphs


def validate_paths(paths: Sequence[Path]) -> tuple[list[str], list[SpecIssue]]:
    """Compile everything under ``paths``; returns the valid names and every problem.

    A path is a model repository if it holds model directories, otherwise a graph folder or
    a single graph file. Graphs may use models from any repository given alongside.
    """
    repos = [p for p in paths if p.is_dir() and _is_repository(p)]
    graphs = [p for p in paths if p not in repos]
    add_import_roots([g if g.is_dir() else g.parent for g in graphs])
    scan = scan_all(repos, graphs)
    compiled = compile_all(scan)
    return compiled.order, compiled.issues


def _is_repository(path: Path) -> bool:
    return any(c.is_dir() and not c.name.startswith(".") for c in path.iterdir()) and not any(
        path.glob("*.y*ml")
    )


def cmd_validate(args: argparse.Namespace) -> int:
    valid, issues = validate_paths([Path(p) for p in args.paths])
    for issue in issues:
        print(f"error: {issue}", file=sys.stderr)
    if issues:
        print(f"{len(issues)} error(s); {len(valid)} valid: {', '.join(valid) or 'none'}", file=sys.stderr)
        return 1
    print(f"ok: {len(valid)} valid ({', '.join(valid)})")
    return 0


def cmd_graph_list(args: argparse.Namespace) -> int:
    repos, graphs = _sources(args)
    add_import_roots(graphs)
    scan = scan_all(repos, graphs)
    compiled = compile_all(scan)
    for name in sorted({*compiled.plans, *compiled.failed}):
        plan = compiled.plans.get(name)
        if plan is None:
            print(f"{name}\tINVALID\t{compiled.failed[name]}")
            continue
        kind = plan.spec.platform
        nodes = ", ".join(f"{n.name}({n.spec.kind})" for n in plan.nodes)
        print(f"{name}\t{kind}\t{nodes}")
    return 0


def cmd_graph_render(args: argparse.Namespace) -> int:
    """Draw one model or graph (by name, or a YAML graph file) as DOT, Mermaid, SVG, PNG or HTML."""
    from flowserve.core.errors import FlowserveError
    from flowserve.observability.render import FORMATS, render
    from flowserve.spec.repository import scan_graphs

    out = str(args.output)
    fmt = (args.format or ("dot" if out == "-" else Path(out).suffix.lstrip("."))).lower()
    fmt = {"mermaid": "mmd", "htm": "html", "gv": "dot"}.get(fmt, fmt)
    if fmt not in FORMATS:
        choices = ",".join(FORMATS)
        print(f"error: unknown format '{fmt}' (use -o FILE.{{{choices}}} or --format)", file=sys.stderr)
        return 2
    repos, graphs = _sources(args)
    target = Path(args.name)
    name = args.name
    if target.suffix in (".yaml", ".yml") or target.is_file():
        if not target.is_file():
            print(f"error: no such graph file: {target}", file=sys.stderr)
            return 1
        own = scan_graphs(target)
        for issue in own.issues:
            print(f"error: {issue}", file=sys.stderr)
        if not own.graphs:
            return 1
        name = next(iter(own.graphs))
        graphs = [g for g in graphs if not (g.is_dir() and target.resolve().is_relative_to(g.resolve()))]
        graphs.append(target)
    add_import_roots([g if g.is_dir() else g.parent for g in graphs])
    scan = scan_all(repos, graphs)
    compiled = compile_all(scan)
    plan = compiled.plans.get(name)
    if plan is None:
        for issue in compiled.issues:
            print(f"error: {issue}", file=sys.stderr)
        known = ", ".join(sorted(compiled.plans)) or "none"
        reason = compiled.failed.get(name, f"unknown model or graph (valid: {known})")
        print(f"error: cannot render '{name}': {reason}", file=sys.stderr)
        return 1
    try:
        data = render(plan, fmt, scan.models, layout_engine=args.layout)
    except FlowserveError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        Path(out).write_bytes(data)
        print(f"wrote {out} ({fmt}, {len(data)} bytes)")
    return 0


def _repositories(args: argparse.Namespace, repos: list[Path]) -> list[Path | str]:
    """The repositories to serve: a URL (s3://, gs://, ...) stays a string (repository/remote.py)."""
    from flowserve.repository.remote import is_remote

    if not args.model_repository:
        return list(repos)
    return [p if is_remote(p) else Path(p) for p in args.model_repository]


def _remote_and_rate_limits(args: argparse.Namespace) -> tuple[RemoteOptions, list[ResourceLimit]]:
    from flowserve.nodes.ratelimit import parse_resource_limit
    from flowserve.repository.remote import RemoteOptions

    cache = Path(args.repository_cache_dir) if args.repository_cache_dir else None
    remote = RemoteOptions(cache, args.repository_complete, args.repository_settle_secs)
    return remote, [parse_resource_limit(text) for text in args.rate_limit_resource or []]


def _header_forward(args: argparse.Namespace) -> dict[str, re.Pattern[str]]:
    from flowserve.dataplane.headers import compile_pattern

    out = {}
    for kind in ("http", "grpc"):
        text = getattr(args, f"{kind}_header_forward_pattern")
        if text:
            out[kind] = compile_pattern(text, f"--{kind}-header-forward-pattern")
    return out


def _grpc_tls(args: argparse.Namespace) -> GrpcTls | None:
    """Triton's gRPC TLS options, checked (ValueError); None when TLS is off."""
    if not (args.grpc_use_ssl or args.grpc_use_ssl_mutual):
        given = [f for f in ("server_cert", "server_key", "root_cert") if getattr(args, f"grpc_{f}")]
        if given:
            names = ", ".join("--grpc-" + f.replace("_", "-") for f in given)
            raise ValueError(f"{names} given without --grpc-use-ssl (or --grpc-use-ssl-mutual)")
        return None
    from flowserve.frontends.grpc.tls import GrpcTls

    return GrpcTls.load(
        args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert, mutual=args.grpc_use_ssl_mutual
    )


def _trace_config(args: argparse.Namespace) -> TraceConfig | None:
    """Triton's ``--trace-config`` items, checked (ValueError); None when none are given."""
    if not args.trace_config:
        return None
    from flowserve.observability.traceconfig import parse_trace_config

    return parse_trace_config(args.trace_config)


def _check_bounds(args: argparse.Namespace) -> None:
    """Timeouts and connection/byte bounds are >= 0 (0: none)."""
    for flag in (
        "max_connections",
        "max_buffered_request_bytes",
        "http_idle_timeout_secs",
        "http_body_timeout_secs",
        "grpc_handshake_timeout_secs",
        "grpc_idle_timeout_secs",
    ):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0 (0: none)")
    if args.http_max_json_bytes is not None and args.http_max_json_bytes <= 0:
        raise ValueError("--http-max-json-bytes must be > 0")


def _flag(text: str) -> bool:
    """A Triton-style boolean option value (``--grpc-use-ssl=true``)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _workers(text: str) -> int:
    """``--workers``: a count >= 1, or ``auto`` (the cores this process may run on)."""
    if text == "auto":
        return len(os.sched_getaffinity(0))
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError("the number of workers must be >= 1")
    return count


def cmd_serve(args: argparse.Namespace) -> int:
    from flowserve.dataplane.access import GRPC_HEADER_PREFIX, Restrictions
    from flowserve.dataplane.plane import Limits
    from flowserve.server import exit_watchdog, serve

    faulthandler.enable()  # a crash in native code prints the Python stacks of every thread
    try:
        http_restrictions = Restrictions.parse(args.http_restricted_api or [])
        grpc_restrictions = Restrictions.parse(args.grpc_restricted_protocol or [], GRPC_HEADER_PREFIX)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    repos, graphs = _sources(args)
    try:
        remote, rate_limits = _remote_and_rate_limits(args)
        header_forward = _header_forward(args)
        grpc_tls = _grpc_tls(args)
        trace_config = _trace_config(args)
        _check_bounds(args)
        if args.log_file:
            with open(args.log_file, "a"):  # the server appends to it; refuse a path it cannot write
                pass
    except OSError as exc:
        print(f"error: --log-file {args.log_file}: {exc.strerror}", file=sys.stderr)
        return 2
    except InvalidArgument as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        repository = RepositorySettings(
            control_mode=args.model_control_mode,
            load_models=tuple(args.load_model or ()),
            poll_secs=args.repository_poll_secs,
            cache_bytes=args.cache_size,
            model_load_threads=args.model_load_thread_count,
            inline_threshold_us=args.inline_threshold_us,
            remote=remote,
        )
    except InvalidArgument as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    options = Settings(
        model_repositories=_repositories(args, repos),
        graph_dirs=graphs,
        repository=repository,
        workers=args.workers,
        rate_limit=args.rate_limit,
        rate_limit_resources=rate_limits,
        header_forward=header_forward,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_shm=args.allow_shm,
        limits=Limits(
            max_request_bytes=args.max_request_bytes,
            max_tensor_elements=args.max_tensor_elements,
            max_bytes_element=args.max_bytes_element,
        ),
        shutdown_grace_s=args.exit_timeout_secs,
        max_connections=args.max_connections,
        max_buffered_request_bytes=args.max_buffered_request_bytes,
        log_file=args.log_file or "",
        http_idle_timeout_s=args.http_idle_timeout_secs,
        http_body_timeout_s=args.http_body_timeout_secs,
        grpc_handshake_timeout_s=args.grpc_handshake_timeout_secs,
        grpc_idle_timeout_s=args.grpc_idle_timeout_secs,
        http_max_json_bytes=args.http_max_json_bytes,
        max_inflight_requests=args.max_inflight_requests,
        max_inflight_per_model=args.max_inflight_per_model,
        http_restrictions=http_restrictions,
        grpc_restrictions=grpc_restrictions,
        grpc_server=args.grpc_server,
        grpc_tls=grpc_tls,
        grpc_response_compression=args.grpc_infer_response_compression_level,
        trace_config=trace_config,
        http_server=args.http_server,
    )
    if args.loop == "uvloop":
        import uvloop

        # about 30 us less CPU per HTTP request than the default loop (measured with uvicorn)
        code = int(uvloop.run(serve(options)))
    else:
        code = asyncio.run(serve(options))
    exit_watchdog()  # a hung node thread must not keep the process from ending
    return code


def build_parser(defaults: Settings | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowserve", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    sub = parser.add_subparsers(dest="command", required=True)

    # every default is the settings object's (flowserve/settings.py), with FLOWSERVE_* applied
    d = Settings.from_env() if defaults is None else defaults
    serve = sub.add_parser("serve", help="serve model repositories and graphs")
    serve.add_argument("--model-repository", action="append", metavar="DIR")
    serve.add_argument("--graphs", action="append", metavar="DIR")
    serve.add_argument(
        "--workers",
        type=_workers,
        default=d.workers,
        metavar="N|auto",
        help="worker processes serving as one server (auto: one per usable core); pinned models "
        "(sequences, response cache, rate limiter, GPU, flowserve.pin) load in one worker only",
    )
    serve.add_argument("--host", default=d.host)
    serve.add_argument("--http-port", type=int, default=d.http_port, help="negative: no HTTP listener")
    serve.add_argument("--grpc-port", type=int, default=d.grpc_port)
    serve.add_argument("--metrics-port", type=int, default=d.metrics_port)
    serve.add_argument(
        "--trace-config",
        action="append",
        metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings (repeatable): level=, rate=, count=, mode=triton|opentelemetry, "
        "triton,file=, triton,log-frequency=, opentelemetry,url=, opentelemetry,resource=K=V, "
        "opentelemetry,bsp_max_queue_size= / bsp_schedule_delay= / bsp_max_export_batch_size=",
    )
    tls = serve.add_argument_group("gRPC TLS (Triton's options; HTTP has none, as in Triton)")
    tls.add_argument(
        "--grpc-use-ssl", type=_flag, nargs="?", const=True, default=False, metavar="BOOL",
        help="serve gRPC over TLS with --grpc-server-cert and --grpc-server-key",
    )  # fmt: skip
    tls.add_argument(
        "--grpc-use-ssl-mutual", type=_flag, nargs="?", const=True, default=False, metavar="BOOL",
        help="TLS, and clients must present a certificate that --grpc-root-cert verifies",
    )  # fmt: skip
    tls.add_argument("--grpc-server-cert", metavar="PEM", help="the server's certificate (chain)")
    tls.add_argument("--grpc-server-key", metavar="PEM", help="the server's private key")
    tls.add_argument("--grpc-root-cert", metavar="PEM", help="CA certificates that verify clients")
    serve.add_argument(
        "--grpc-infer-response-compression-level",
        choices=["none", "low", "medium", "high"],
        default=d.grpc_response_compression,
        help="compress gRPC inference responses (gzip or deflate, as the client accepts), as Triton",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default=d.repository.control_mode,
        help="none: load all, no load/unload API; explicit: only --load-model and the API; "
        "poll: load all and re-scan every --repository-poll-secs",
    )
    serve.add_argument(
        "--load-model", action="append", metavar="NAME", help="explicit mode: load at start ('*': all)"
    )
    serve.add_argument("--repository-poll-secs", type=float, default=d.repository.poll_secs)
    serve.add_argument(
        "--repository-cache-dir",
        metavar="DIR",
        help="where remote repositories (s3://, gs://, az://, any fsspec URL) are mirrored "
        "(default: a temporary directory removed at exit)",
    )
    serve.add_argument(
        "--repository-complete",
        choices=["stable", "marker"],
        default=d.repository.remote.complete,
        help="when a remote version directory is complete: 'stable' (the same in two listings "
        "--repository-settle-secs apart) or 'marker' (it holds a .complete file, written last)",
    )
    serve.add_argument(
        "--repository-settle-secs", type=float, default=d.repository.remote.settle_s, metavar="S"
    )
    serve.add_argument(
        "--rate-limit",
        choices=["off", "execution_count"],
        default=d.rate_limit,
        help="Triton's rate limiter: instances run only when their instance_group.rate_limiter "
        "resources are free, fewest executions (scaled by priority) first",
    )
    for kind in ("http", "grpc"):
        serve.add_argument(
            f"--{kind}-header-forward-pattern",
            metavar="REGEX",
            help=f"{kind.upper()} request headers whose name matches become request parameters "
            "(a split node can route by them)",
        )
    serve.add_argument(
        "--rate-limit-resource",
        action="append",
        metavar="NAME:COUNT[:DEVICE]",
        help="units of a rate limiter resource (default: the most one instance asks for)",
    )
    serve.add_argument(
        "--cache-size",
        type=int,
        default=d.repository.cache_bytes,
        metavar="BYTES",
        help="response cache size (LRU, shared); models opt in with response_cache { enable: true }",
    )
    serve.add_argument(
        "--inline-threshold-us",
        type=float,
        default=d.repository.inline_threshold_us,
        help="run Python work on the event loop while it takes less than this (0: always on threads)",
    )
    serve.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="event loop")
    serve.add_argument(
        "--allow-shm", action="store_true", default=d.allow_shm, help="allow client system shared memory"
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=d.limits.max_request_bytes,
        help="largest request body accepted",
    )
    serve.add_argument(
        "--max-tensor-elements",
        type=int,
        default=d.limits.max_tensor_elements,
        metavar="N",
        help="most elements one input tensor may have (and largest dimension)",
    )
    serve.add_argument(
        "--max-bytes-element",
        type=int,
        default=d.limits.max_bytes_element,
        metavar="BYTES",
        help="largest single element of a BYTES input",
    )
    serve.add_argument(
        "--max-inflight-requests",
        type=int,
        default=d.max_inflight_requests,
        metavar="N",
        help="inference requests in flight at once, server-wide; more are refused with UNAVAILABLE "
        "(0: no bound)",
    )
    serve.add_argument(
        "--max-inflight-per-model",
        type=int,
        default=d.max_inflight_per_model,
        metavar="N",
        help="inference requests in flight at once for one model or graph (0: no bound)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="open connections per listener (HTTP, gRPC, metrics); more are closed at once and logged "
        "(0: no cap)",
    )
    serve.add_argument(
        "--max-buffered-request-bytes",
        type=int,
        default=d.max_buffered_request_bytes,
        metavar="BYTES",
        help="request bytes held in memory across all requests; a request that does not fit is refused "
        "before it is read (HTTP 503, gRPC RESOURCE_EXHAUSTED; 0: no budget)",
    )
    timeouts = serve.add_argument_group("connection timeouts (seconds; 0: none)")
    timeouts.add_argument(
        "--http-idle-timeout-secs",
        type=float,
        default=d.http_idle_timeout_s,
        metavar="S",
        help="an HTTP connection with no request, or with a request head still incomplete, is closed",
    )
    timeouts.add_argument(
        "--http-body-timeout-secs",
        type=float,
        default=d.http_body_timeout_s,
        metavar="S",
        help="a request body that makes no progress this long gets 408 and the connection closes",
    )
    timeouts.add_argument(
        "--grpc-handshake-timeout-secs",
        type=float,
        default=d.grpc_handshake_timeout_s,
        metavar="S",
        help="TLS handshake, HTTP/2 preface and first SETTINGS of a gRPC connection must be done within it",
    )
    timeouts.add_argument(
        "--grpc-idle-timeout-secs",
        type=float,
        default=d.grpc_idle_timeout_s,
        metavar="S",
        help="a gRPC connection with no open call and no frame this long gets GOAWAY and is closed",
    )
    serve.add_argument(
        "--http-max-json-bytes",
        type=int,
        default=d.http_max_json_bytes,
        metavar="BYTES",
        help="largest JSON request body (or JSON header of a binary request); default 32 MiB, at most "
        "--max-request-bytes; larger tensors go as binary data",
    )
    serve.add_argument(
        "--log-file",
        metavar="PATH",
        help="also write the log to this file (Triton's flag; the only way to set it: the logging API "
        "cannot change file locations)",
    )
    serve.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=d.shutdown_grace_s,
        metavar="S",
        help="on SIGTERM/SIGINT, how long in-flight requests may take to finish before they are cancelled",
    )
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        metavar="API[,API...]:KEY=VALUE",
        help="HTTP API categories (health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging) that need header KEY: VALUE (repeatable)",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        metavar="API[,API...]:KEY=VALUE",
        help="gRPC categories (as --http-restricted-api) that need metadata triton-grpc-protocol-KEY: VALUE",
    )
    serve.add_argument(
        "--grpc-server",
        choices=GRPC_SERVERS,
        default=d.grpc_server,
        help="gRPC transport: flowserve's own HTTP/2 server (native, about a tenth of grpcio's CPU per "
        "call) or grpc's asyncio server (grpcio)",
    )
    serve.add_argument(
        "--http-server",
        choices=HTTP_SERVERS,
        default=d.http_server,
        help="HTTP/1.1 server: flowserve's own (native, about two thirds of uvicorn's CPU per request) or "
        "uvicorn with httptools (uvicorn)",
    )
    serve.add_argument(
        "--model-load-thread-count",
        type=int,
        default=d.repository.model_load_threads,
        metavar="N",
        help="models loaded at once, and instances of one model for backends that allow it (Triton's)",
    )
    serve.set_defaults(func=cmd_serve)

    validate = sub.add_parser("validate", help="check repositories and graphs, list every error")
    validate.add_argument("paths", nargs="+")
    validate.set_defaults(func=cmd_validate)

    graph = sub.add_parser("graph", help="inspect graphs")
    graph_sub = graph.add_subparsers(dest="graph_command", required=True)
    glist = graph_sub.add_parser("list", help="list models and graphs with their nodes")
    glist.add_argument("--model-repository", action="append", metavar="DIR")
    glist.add_argument("--graphs", action="append", metavar="DIR")
    glist.set_defaults(func=cmd_graph_list)
    grender = graph_sub.add_parser(
        "render", help="draw a model or graph: DOT, Mermaid (.mmd), SVG, PNG or a self-contained HTML page"
    )
    grender.add_argument("name", metavar="NAME_OR_FILE", help="a model/graph name, or a YAML graph file")
    grender.add_argument(
        "-o", "--output", default="-", help="output file; the extension picks the format (default: stdout)"
    )
    grender.add_argument("--format", choices=["dot", "mmd", "mermaid", "svg", "png", "html"])
    grender.add_argument(
        "--layout",
        choices=["auto", "dot", "builtin"],
        default="auto",
        help="SVG/HTML layout: graphviz's dot (needed for PNG) or the built-in one (auto: dot if installed)",
    )
    grender.add_argument("--model-repository", action="append", metavar="DIR")
    grender.add_argument("--graphs", action="append", metavar="DIR")
    grender.set_defaults(func=cmd_graph_render)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        defaults = Settings.from_env()
    except InvalidArgument as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    args = build_parser(defaults).parse_args(argv)
    from flowserve.observability.logs import configure

    configure(args.log_level, json_lines=args.log_json)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
