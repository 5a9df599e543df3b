"""``flowserve serve | validate | graph list | graph render``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from flowserve.analyze.cli import add_parser as add_analyze
from flowserve.bench.cli import add_parser as add_bench
from flowserve.cluster import affinity
from flowserve.core.errors import InvalidArgument
from flowserve.core.version import VERSION
from flowserve.frontends import GRPC_SERVERS, HTTP_SERVERS
from flowserve.nodes.factory import compile_all, users_of
from flowserve.repository.check import load_check
from flowserve.repository.repository import add_import_roots, scan_all
from flowserve.repository.settings import RepositorySettings
from flowserve.settings import Settings
from flowserve.spec.layout import Sources, is_url, resolve_sources
from flowserve.spec.modelfiles import missing_model_files

if TYPE_CHECKING:
    from flowserve.dataplane.headers import HeaderPattern
    from flowserve.frontends.grpc.tls import GrpcTls
    from flowserve.nodes.ratelimit import ResourceLimit
    from flowserve.observability.traceconfig import TraceConfig
    from flowserve.repository.remote import RemoteOptions

DESCRIPTION = """\
A dataflow inference server: Triton's protocol (HTTP/REST and gRPC), Triton model
repositories (config.pbtxt) and YAML graphs of models and Python nodes."""
EPILOG = """\
PATH (serve, validate, graph list) is a project folder holding model_repository/ and graphs/
(with the nodes/ they import), a graph folder or file, or a Triton model repository; none is the
current folder. 'flowserve COMMAND --help' lists a command's options."""


def _sources(args: argparse.Namespace) -> Sources:
    """What the command's PATHs, --model-repository and --graphs name (spec/layout.py)."""
    return resolve_sources(getattr(args, "paths", None) or [], args.model_repository or [], args.graphs or [])


def cmd_validate(args: argparse.Namespace) -> int:
    """Scan and compile what serve would serve, then (unless --no-load) load it as serve does."""
    sources = _sources(args)
    problem = _unreadable_sources(args, sources)
    urls = [s for s in [*sources.repositories, *sources.graphs] if isinstance(s, str)]
    if problem or urls:
        print(f"error: {problem or f'{urls[0]}: validate reads local folders only'}", file=sys.stderr)
        return 2
    repos = [Path(r) for r in sources.repositories]
    graphs = [Path(g) for g in sources.graphs]
    add_import_roots([g if g.is_dir() else g.parent for g in graphs])
    scan = scan_all(repos, graphs)
    compiled = compile_all(scan)
    no_file = missing_model_files(m for n, m in scan.models.items() if n in compiled.plans)
    errors = [str(i) for i in [*compiled.issues, *no_file]]
    no_file_sources = {i.file for i in no_file}
    broken = set(compiled.failed) | {n for n, m in scan.models.items() if m.source in no_file_sources}
    users = users_of(scan, broken)  # they cannot serve either: not valid, and no error of their own
    valid = [n for n in compiled.order if n not in broken and n not in users]
    blocked = sorted(users)
    if args.load and valid:
        with _quiet_log(args.log_level):
            report = asyncio.run(load_check(repos, graphs, skip=broken))
        errors += [str(f) for f in report.failures]
        blocked = sorted({*blocked, *report.blocked})
        valid = [n for n in valid if n in report.loaded]
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if blocked:
        verb = "loaded" if args.load else "valid"
        print(f"not {verb}, as they use what failed: {', '.join(blocked)}", file=sys.stderr)
    what = "valid and loaded" if args.load else "valid"
    if errors:
        print(f"{len(errors)} error(s); {len(valid)} {what}: {', '.join(valid) or 'none'}", file=sys.stderr)
        return 1
    print(f"ok: {len(valid)} {what} ({', '.join(valid) or 'nothing found'})")
    return 0


def _local(sources: Sources) -> tuple[list[Path], list[Path]]:
    """The repositories and graph folders as local paths (graph list and render read no URL)."""
    return [Path(r) for r in sources.repositories], [Path(g) for g in sources.graphs]


@contextlib.contextmanager
def _quiet_log(level: str) -> Iterator[None]:
    """While validate loads, the server's own log lines (each failure again, each load) are left
    out: validate lists the failures itself. --log-level DEBUG shows everything."""
    logger = logging.getLogger("flowserve")
    before = logger.level
    if level != "DEBUG":
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)


def cmd_init(args: argparse.Namespace) -> int:
    """Create a project that serves and answers as created (flowserve/scaffold)."""
    from flowserve.scaffold import create_project

    root = Path(args.directory)
    try:
        written = create_project(root, overwrite=args.force)
    except FileExistsError as exc:
        print(f"error: {exc} (--force overwrites)", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {root}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"created a flowserve project in {root}:")
    for path in written:
        print(f"  {path.relative_to(root)}")
    steps = [] if root.resolve() == Path.cwd().resolve() else [f"cd {args.directory}"]
    steps += [
        "flowserve validate      # check it, loading the model and the node once",
        "flowserve serve         # HTTP on 8000, gRPC on 8001",
        "python client.py        # from another shell: calls the graph 'hello'",
    ]
    print("\nnext:\n" + "\n".join(f"  {step}" for step in steps))
    return 0


def cmd_graph_list(args: argparse.Namespace) -> int:
    repos, graphs = _local(_sources(args))
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
    repos, graphs = _local(_sources(args))
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


def _remote_and_rate_limits(args: argparse.Namespace) -> tuple[RemoteOptions, list[ResourceLimit]]:
    from flowserve.nodes.ratelimit import parse_resource_limit
    from flowserve.repository.remote import RemoteOptions

    cache = Path(args.repository_cache_dir) if args.repository_cache_dir else None
    remote = RemoteOptions(cache, args.repository_complete, args.repository_settle_secs)
    return remote, [parse_resource_limit(text) for text in args.rate_limit_resource or []]


def _header_forward(args: argparse.Namespace) -> dict[str, HeaderPattern]:
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
        "max_connections_per_peer",
        "max_unsent_response_bytes",
        "http_idle_timeout_secs",
        "http_body_timeout_secs",
        "grpc_handshake_timeout_secs",
        "grpc_idle_timeout_secs",
        "grpc_body_timeout_secs",
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
    hint = " (a PATH after a BOOL option goes first, or write the option as --option=true)"
    path_like = Path(text).exists() or "/" in text
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}{hint if path_like else ''}")


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


def _unreadable_sources(args: argparse.Namespace, sources: Sources) -> str | None:
    """The first path given that cannot be served (missing, not a directory, unreadable), as one
    line naming it; None when all can be read."""
    given = [("--model-repository ", p) for p in args.model_repository or [] if not is_url(p)]
    given += [("--graphs ", p) for p in args.graphs or [] if not is_url(p)]
    given += [("", p) for p in getattr(args, "paths", None) or [] if not is_url(p)]
    for flag, text in given:
        path = Path(text)
        if not path.exists():
            return f"{flag}{text}: no such {'directory' if flag else 'file or directory'}"
        if flag.startswith("--model-repository") and not path.is_dir():
            return f"{flag}{text}: not a directory"
        if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
            return f"{flag}{text}: permission denied (cannot read it)"
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    from flowserve.dataplane.access import GRPC_HEADER_PREFIX, Restrictions
    from flowserve.dataplane.plane import Limits
    from flowserve.server import exit_watchdog, serve

    # a crash in native code prints the Python stacks of every thread (unless stderr is no file)
    with contextlib.suppress(OSError, ValueError):
        faulthandler.enable()
    try:
        http_restrictions = Restrictions.parse(args.http_restricted_api or [])
        grpc_restrictions = Restrictions.parse(args.grpc_restricted_protocol or [], GRPC_HEADER_PREFIX)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sources = _sources(args)
    problem = _unreadable_sources(args, sources)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.strict_model_config:
        print(
            "warning: --strict-model-config=true is not enforced: configs are auto-completed where "
            "the model allows it",
            file=sys.stderr,
        )
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
            ray_address=args.ray_address,
            error_traceback=args.error_traceback,
        )
    except InvalidArgument as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    options = Settings(
        model_repositories=sources.repositories,
        graph_dirs=sources.graphs,
        repository=repository,
        workers=args.workers,
        cpu_affinity=args.cpu_affinity,
        rate_limit=args.rate_limit,
        rate_limit_resources=rate_limits,
        header_forward=header_forward,
        host=args.host,
        http_port=args.http_port if args.allow_http else -1,
        grpc_port=args.grpc_port if args.allow_grpc else -1,
        metrics_port=args.metrics_port if args.allow_metrics else -1,
        openai_port=args.openai_port,
        allow_shm=args.allow_shm,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        limits=Limits(
            max_request_bytes=args.max_request_bytes,
            max_tensor_elements=args.max_tensor_elements,
            max_bytes_element=args.max_bytes_element,
            max_bytes_elements_per_request=args.max_bytes_elements_per_request,
        ),
        shutdown_grace_s=args.exit_timeout_secs,
        max_connections=args.max_connections,
        max_buffered_request_bytes=args.max_buffered_request_bytes,
        max_connections_per_peer=args.max_connections_per_peer,
        max_unsent_response_bytes=args.max_unsent_response_bytes,
        log_file=args.log_file or "",
        http_idle_timeout_s=args.http_idle_timeout_secs,
        http_body_timeout_s=args.http_body_timeout_secs,
        grpc_handshake_timeout_s=args.grpc_handshake_timeout_secs,
        grpc_idle_timeout_s=args.grpc_idle_timeout_secs,
        grpc_body_timeout_s=args.grpc_body_timeout_secs,
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
        ray_address=args.ray_address,
    )
    if args.loop == "uvloop":
        import uvloop

        # about 30 us less CPU per HTTP request than the default loop (measured with uvicorn)
        code = int(uvloop.run(serve(options)))
    else:
        code = asyncio.run(serve(options))
    exit_watchdog()  # a hung node thread must not keep the process from ending
    return code


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, "", argparse.SUPPRESS, [], ()) or "%(default)" in text or not text:
            return text
        switches = argparse._StoreTrueAction | argparse._StoreFalseAction | argparse._VersionAction
        if isinstance(action, switches):
            return text  # a switch: "--no-load (default: True)" would read as if it were on
        return text + " (default: %(default)s)"


class _TopFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The top-level help keeps its description's and epilog's lines as written."""


class _Parser(argparse.ArgumentParser):
    """A command-line mistake is one line on stderr (and status 2), never a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _log_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: Any) -> None:
    """--log-level and --log-json, before or after the subcommand (after: ``default`` SUPPRESS,
    so an option given before the subcommand is not overwritten)."""
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO" if default is None else default,
        help="log level" if default is None else "log level (default: INFO)",
    )
    parser.add_argument(
        "--log-json",
        action="store_true",
        default=False if default is None else default,
        help="log one JSON object per line",
    )


def _path_args(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help=f"{what} (none: the current folder)")


def _source_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        metavar="DIR",
        help="a Triton model repository (repeatable)",
    )
    parser.add_argument(
        "--graphs", action="append", metavar="DIR", help="a folder of YAML graphs (repeatable)"
    )


def build_parser(defaults: Settings | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="flowserve",
        usage="%(prog)s [--version] [--log-level LEVEL] [--log-json] COMMAND ...",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_TopFormatter,
    )
    parser.add_argument("--version", action="version", version=f"flowserve {VERSION}")
    _log_flags(parser, None)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands", prog="flowserve"
    )
    log_parent = argparse.ArgumentParser(add_help=False)
    _log_flags(log_parent, argparse.SUPPRESS)

    def command(
        name: str,
        help_text: str,
        under: Any = sub,
        logs: bool = True,
        usage: str | None = None,
        description: str | None = None,
    ) -> argparse.ArgumentParser:
        new: argparse.ArgumentParser = under.add_parser(
            name,
            help=help_text,
            description=description or help_text,
            usage=usage,
            parents=[log_parent] if logs else [],
            formatter_class=_Formatter,
        )
        return new

    # every default is the settings object's (flowserve/settings.py), with FLOWSERVE_* applied
    d = Settings.from_env() if defaults is None else defaults
    serve = command(
        "serve",
        "serve models and graphs over HTTP and gRPC",
        logs=False,
        description="serve models and graphs over HTTP and gRPC with Triton's protocol (and /metrics)",
        usage="%(prog)s [PATH ...] [--http-port PORT] [--grpc-port PORT] [--workers N|auto] [OPTION ...]",
    )
    serve._optionals.title = "common options"
    serve.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a project folder (model_repository/, graphs/, nodes/), a graph folder or a Triton model "
        "repository (s3://... too); none: the current folder",
    )
    # the groups of --help, in the order shown (every option belongs to one)
    common = serve._optionals  # -h, where to serve from, where to listen
    models = serve.add_argument_group("models and repositories")
    startup = serve.add_argument_group("startup, readiness and shutdown (Triton's options)")
    listen = serve.add_argument_group("listeners and protocols")
    limits = serve.add_argument_group("limits and overload")
    timeouts = serve.add_argument_group("connection timeouts (seconds; 0: none)")
    security = serve.add_argument_group(
        "security: gRPC TLS (Triton's options; HTTP has none), access, shared memory"
    )
    execution = serve.add_argument_group("execution: rate limiter, response cache, threads, Ray")
    logs = serve.add_argument_group("logging, tracing and debugging")
    _log_flags(logs, argparse.SUPPRESS)
    common.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        metavar="DIR|URL",
        help="a Triton model repository (repeatable; s3://, gs://, az:// too), served with the PATHs",
    )
    common.add_argument(
        "--graphs",
        action="append",
        metavar="DIR",
        help="a folder of YAML graphs (repeatable; s3://, gs://, az:// too, with the nodes/ beside it)",
    )
    common.add_argument(
        "--workers",
        type=_workers,
        default=d.workers,
        metavar="N|auto",
        help="worker processes serving as one server (auto: one per usable core); pinned models "
        "(sequences, response cache, rate limiter, flowserve.pin) load in one worker only",
    )
    common.add_argument(
        "--host",
        "--http-address",
        "--grpc-address",
        "--metrics-address",
        default=d.host,
        metavar="ADDRESS",
        help="the address every listener binds (Triton's --http-address, --grpc-address and "
        "--metrics-address are accepted: here one address serves all three)",
    )
    for kind, port, what in (
        ("http", d.http_port, "HTTP/REST"),
        ("grpc", d.grpc_port, "gRPC"),
        ("metrics", d.metrics_port, "Prometheus /metrics"),
    ):
        common.add_argument(
            f"--{kind}-port", type=int, default=port, metavar="PORT", help=f"{what} port (negative: off)"
        )
    common.add_argument(
        "--openai-port", type=int, default=d.openai_port, metavar="PORT",
        help="OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/embeddings, "
        "/v1/models) over the generation models and graphs on this port (default: off)",
    )  # fmt: skip
    for kind, what in (("http", "HTTP/REST"), ("grpc", "gRPC"), ("metrics", "/metrics")):
        listen.add_argument(
            f"--allow-{kind}", type=_flag, nargs="?", const=True, default=True, metavar="BOOL",
            help=f"serve {what} (Triton's flag; false: the same as a negative --{kind}-port)",
        )  # fmt: skip
    startup.add_argument(
        "--strict-readiness", type=_flag, nargs="?", const=True, default=d.strict_readiness, metavar="BOOL",
        help="not ready (/v2/health/ready, gRPC ServerReady) while a model or graph failed to load; "
        "false: ready once serving, whatever failed",
    )  # fmt: skip
    startup.add_argument(
        "--exit-on-error", type=_flag, nargs="?", const=True, default=d.exit_on_error, metavar="BOOL",
        help="exit with status 1 when a model or graph fails to load at start (Triton's default is "
        "true; here false: the others serve and, with --strict-readiness, the server is not ready)",
    )  # fmt: skip
    models.add_argument(
        "--strict-model-config", "--disable-auto-complete-config", type=_flag, nargs="?", const=True,
        default=False, metavar="BOOL",
        help="accepted for Triton's command lines; configs are always auto-completed where a model "
        "allows it (Triton's default), true only logs a warning",
    )  # fmt: skip
    logs.add_argument(
        "--trace-config",
        action="append",
        metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings (repeatable): level=, rate=, count=, mode=triton|opentelemetry, "
        "triton,file=, triton,log-frequency=, opentelemetry,url=, opentelemetry,resource=K=V, "
        "opentelemetry,bsp_max_queue_size= / bsp_schedule_delay= / bsp_max_export_batch_size=",
    )
    security.add_argument(
        "--grpc-use-ssl", type=_flag, nargs="?", const=True, default=False, metavar="BOOL",
        help="serve gRPC over TLS with --grpc-server-cert and --grpc-server-key",
    )  # fmt: skip
    security.add_argument(
        "--grpc-use-ssl-mutual", type=_flag, nargs="?", const=True, default=False, metavar="BOOL",
        help="TLS, and clients must present a certificate that --grpc-root-cert verifies",
    )  # fmt: skip
    security.add_argument("--grpc-server-cert", metavar="PEM", help="the server's certificate (chain)")
    security.add_argument("--grpc-server-key", metavar="PEM", help="the server's private key")
    security.add_argument("--grpc-root-cert", metavar="PEM", help="CA certificates that verify clients")
    listen.add_argument(
        "--grpc-infer-response-compression-level",
        choices=["none", "low", "medium", "high"],
        default=d.grpc_response_compression,
        help="compress gRPC inference responses (gzip or deflate, as the client accepts), as Triton",
    )
    models.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default=d.repository.control_mode,
        help="none: load all, no load/unload API; explicit: only --load-model and the API; "
        "poll: load all, then every --repository-poll-secs reload what changed (model "
        "directories, graph files, and the nodes/*.py code a graph's python nodes run), load "
        "what was added, unload what was removed; a failed reload is logged and the loaded "
        "version keeps serving",
    )
    models.add_argument(
        "--load-model", action="append", metavar="NAME", help="explicit mode: load at start ('*': all)"
    )
    models.add_argument(
        "--repository-poll-secs",
        type=float,
        default=d.repository.poll_secs,
        metavar="S",
        help="poll mode: seconds between two scans of the repositories",
    )
    models.add_argument(
        "--repository-cache-dir",
        metavar="DIR",
        help="where remote repositories (s3://, gs://, az://, any fsspec URL) are mirrored "
        "(default: a temporary directory removed at exit)",
    )
    models.add_argument(
        "--repository-complete",
        choices=["stable", "marker"],
        default=d.repository.remote.complete,
        help="when a remote version directory is complete: 'stable' (the same in two listings "
        "--repository-settle-secs apart) or 'marker' (it holds a .complete file, written last)",
    )
    models.add_argument(
        "--repository-settle-secs",
        type=float,
        default=d.repository.remote.settle_s,
        metavar="S",
        help="--repository-complete stable: how far apart the two listings are",
    )
    execution.add_argument(
        "--rate-limit",
        choices=["off", "execution_count"],
        default=d.rate_limit,
        help="Triton's rate limiter: instances run only when their instance_group.rate_limiter "
        "resources are free, fewest executions (scaled by priority) first",
    )
    for kind in ("http", "grpc"):
        listen.add_argument(
            f"--{kind}-header-forward-pattern",
            metavar="REGEX",
            help=f"{kind.upper()} request headers whose name matches become request parameters "
            "(a split node can route by them)",
        )
    execution.add_argument(
        "--rate-limit-resource",
        action="append",
        metavar="NAME:COUNT[:DEVICE]",
        help="units of a rate limiter resource (default: the most one instance asks for)",
    )
    execution.add_argument(
        "--cache-size",
        type=int,
        default=d.repository.cache_bytes,
        metavar="BYTES",
        help="response cache size (LRU, shared); models opt in with response_cache { enable: true }",
    )
    execution.add_argument(
        "--cpu-affinity",
        choices=list(affinity.MODES),
        default=d.cpu_affinity,
        help="with --workers N: 'spread' holds each worker to its own share of the cores "
        "(best for Python models and workers each kept busy; a worker then cannot borrow "
        "another's idle core), 'none' lets the kernel move them (default: %(default)s)",
    )
    execution.add_argument(
        "--inline-threshold-us",
        type=float,
        metavar="US",
        default=d.repository.inline_threshold_us,
        help="run Python work on the event loop while it takes less than this (0: always on threads)",
    )
    listen.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="event loop")
    security.add_argument(
        "--allow-shm", type=_flag, nargs="?", const=True, default=d.allow_shm, metavar="BOOL",
        help="client system shared memory (on, as in Triton; --allow-shm=false refuses it; "
        "--http-restricted-api / --grpc-restricted-protocol shared-memory:KEY=VALUE restricts it)",
    )  # fmt: skip
    limits.add_argument(
        "--max-request-bytes",
        type=int,
        metavar="BYTES",
        default=d.limits.max_request_bytes,
        help="largest request body accepted",
    )
    limits.add_argument(
        "--max-tensor-elements",
        type=int,
        default=d.limits.max_tensor_elements,
        metavar="N",
        help="most elements one input tensor may have (and largest dimension)",
    )
    limits.add_argument(
        "--max-bytes-element",
        type=int,
        default=d.limits.max_bytes_element,
        metavar="BYTES",
        help="largest single element of a BYTES input",
    )
    limits.add_argument(
        "--max-bytes-elements-per-request",
        type=int,
        default=d.limits.max_bytes_elements_per_request,
        metavar="N",
        help="most BYTES elements one request may carry, all its inputs together (each becomes a "
        "Python object)",
    )
    limits.add_argument(
        "--max-inflight-requests",
        type=int,
        default=d.max_inflight_requests,
        metavar="N",
        help="inference requests in flight at once, server-wide; more are refused with UNAVAILABLE "
        "(0: no bound)",
    )
    limits.add_argument(
        "--max-inflight-per-model",
        type=int,
        default=d.max_inflight_per_model,
        metavar="N",
        help="inference requests in flight at once for one model or graph (0: no bound)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="open connections per listener (HTTP, gRPC, metrics); when full, the connection idle the "
        "longest is evicted to make room, and only when none is idle is a new one closed at once and "
        "logged (0: no cap)",
    )
    limits.add_argument(
        "--max-connections-per-peer",
        type=int,
        default=d.max_connections_per_peer,
        metavar="N",
        help="open connections per listener from one client address, with the same eviction of idle "
        "ones (behind a proxy, all clients share the proxy's address: raise it or 0; 0: no cap)",
    )
    limits.add_argument(
        "--max-buffered-request-bytes",
        type=int,
        default=d.max_buffered_request_bytes,
        metavar="BYTES",
        help="request bytes held in memory across all requests; a request that does not fit is refused "
        "before it is read (HTTP 503, gRPC RESOURCE_EXHAUSTED; 0: no budget)",
    )
    limits.add_argument(
        "--max-unsent-response-bytes",
        type=int,
        default=d.max_unsent_response_bytes,
        metavar="BYTES",
        help="response bytes encoded but not yet taken by their clients, across all connections; past "
        "it, the connections holding the most are closed (0: no budget)",
    )
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
        help="a gRPC connection with no call this long (keep-alive PINGs do not count) gets GOAWAY and is "
        "closed",
    )
    timeouts.add_argument(
        "--grpc-body-timeout-secs",
        type=float,
        default=d.grpc_body_timeout_s,
        metavar="S",
        help="a gRPC call whose request message makes no progress this long ends DEADLINE_EXCEEDED",
    )
    limits.add_argument(
        "--http-max-json-bytes",
        type=int,
        default=d.http_max_json_bytes,
        metavar="BYTES",
        help="largest JSON request body (or JSON header of a binary request); default 32 MiB, at most "
        "--max-request-bytes; larger tensors go as binary data",
    )
    logs.add_argument(
        "--log-verbose",
        type=int,
        metavar="N",
        help="Triton's verbose logging level: 1 or more logs at DEBUG (the same as --log-level DEBUG)",
    )
    logs.add_argument(
        "--log-file",
        metavar="PATH",
        help="also write the log to this file (Triton's flag; the only way to set it: the logging API "
        "cannot change file locations)",
    )
    startup.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=d.shutdown_grace_s,
        metavar="S",
        help="on SIGTERM/SIGINT, how long in-flight requests may take to finish before they are cancelled",
    )
    security.add_argument(
        "--http-restricted-api",
        action="append",
        metavar="API[,API...]:KEY=VALUE",
        help="HTTP API categories (health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging) that need header KEY: VALUE (repeatable)",
    )
    security.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        metavar="API[,API...]:KEY=VALUE",
        help="gRPC categories (as --http-restricted-api) that need metadata triton-grpc-protocol-KEY: VALUE",
    )
    listen.add_argument(
        "--grpc-server",
        choices=GRPC_SERVERS,
        default=d.grpc_server,
        help="gRPC transport: flowserve's own HTTP/2 server (native, about a tenth of grpcio's CPU per "
        "call) or grpc's asyncio server (grpcio)",
    )
    listen.add_argument(
        "--http-server",
        choices=HTTP_SERVERS,
        default=d.http_server,
        help="HTTP/1.1 server: flowserve's own (native, about two thirds of uvicorn's CPU per request) or "
        "uvicorn with httptools (uvicorn)",
    )
    models.add_argument(
        "--model-load-thread-count",
        type=int,
        default=d.repository.model_load_threads,
        metavar="N",
        help="models loaded at once, and instances of one model for backends that allow it (Triton's)",
    )
    execution.add_argument(
        "--ray-address",
        default=d.ray_address,
        metavar="ADDRESS",
        help="the Ray cluster that KIND_RAY instances run on: HOST:PORT (or ray://HOST:PORT), 'auto' "
        "(the cluster this machine runs, else a new local one) or 'local' (a new local one); "
        "without it a model asking for KIND_RAY fails to load",
    )
    logs.add_argument(
        "--error-traceback", type=_flag, nargs="?", const=True, default=d.repository.error_traceback,
        metavar="BOOL",
        help="a failing node's error response (and a failed load request's) carries the traceback of "
        "its Python code (file:line; the log always has it): for development, it shows the server's "
        "file paths to clients",
    )  # fmt: skip
    serve.set_defaults(func=cmd_serve)

    validate = command(
        "validate",
        "check what serve would serve, list every error",
        description="check what serve would serve and list every error: read and compile every model "
        "and graph, then load and start each once as serve would (--no-load: read and compile only)",
    )
    _path_args(validate, "project folders, graph folders or files, or model repositories")
    _source_flags(validate)
    validate.add_argument(
        "--no-load",
        dest="load",
        action="store_false",
        help="only read and compile: open no model file and initialize no Python model or node (by "
        "default each is loaded and started as serve would, then stopped)",
    )
    validate.set_defaults(func=cmd_validate)

    init = command(
        "init",
        "create a project that serves as it is",
        description="create a project that serves as it is: a batched model, a Python node, a YAML "
        "graph that chains them and a client script that calls the graph",
    )
    init.add_argument(
        "directory", nargs="?", default=".", metavar="DIR", help="where to create it (made if missing)"
    )
    init.add_argument("--force", action="store_true", help="overwrite files that are there already")
    init.set_defaults(func=cmd_init)

    graph = command("graph", "inspect graphs")
    graph_sub = graph.add_subparsers(dest="graph_command", required=True, metavar="COMMAND")
    glist = command("list", "list models and graphs with their nodes", graph_sub)
    _path_args(glist, "as serve's PATH")
    _source_flags(glist)
    glist.set_defaults(func=cmd_graph_list)
    grender = command(
        "render",
        "draw a model or graph: DOT, Mermaid (.mmd), SVG, PNG or a self-contained HTML page",
        graph_sub,
    )
    grender.add_argument("name", metavar="NAME_OR_FILE", help="a model/graph name, or a YAML graph file")
    grender.add_argument(
        "-o", "--output", default="-", help="output file ('-': stdout); the extension picks the format"
    )
    grender.add_argument(
        "--format",
        choices=["dot", "mmd", "mermaid", "svg", "png", "html"],
        help="output format (default: from the output file's extension; dot on stdout)",
    )
    grender.add_argument(
        "--layout",
        choices=["auto", "dot", "builtin"],
        default="auto",
        help="SVG/HTML layout: graphviz's dot (PNG always needs it) or the built-in one (auto: dot if "
        "installed)",
    )
    _source_flags(grender)
    grender.set_defaults(func=cmd_graph_render)
    add_bench(command)
    add_analyze(command)
    return parser


def cpu_thread_defaults() -> None:
    """OpenMP's threads (torch's intra-op pool on the CPU) wait for work passively unless the
    user chose otherwise (``OMP_WAIT_POLICY``). Spinning is libgomp's default: its threads
    busy-wait between parallel regions, and in a server they spin on the cores the event loop,
    the other instances and any co-located client need. Measured on this project's 2-core
    machine (docs/reference/performance.md): a served conv net over system shm, passive against
    spinning, 1.01-1.15x on a quiet machine and 9x under load (932-948 against 105 infer/s).
    Set here, before anything imports torch (libgomp reads it once, at load), and so inherited
    by ``--workers``' processes and the servers ``analyze`` starts."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: Sequence[str] | None = None) -> int:
    from flowserve.dataplane.memory import tune_malloc

    cpu_thread_defaults()
    tune_malloc()
    try:
        defaults = Settings.from_env()
    except InvalidArgument as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    parser = build_parser(defaults)
    args = parser.parse_args(argv)
    from flowserve.observability.logs import configure

    level = "DEBUG" if (getattr(args, "log_verbose", None) or 0) > 0 else args.log_level
    configure(level, json_lines=args.log_json)
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
