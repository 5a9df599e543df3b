"""The server's settings: one object, defined once here with its defaults.

:class:`Settings` is what a server is started with. It is fed by the command line (``cli.py``
takes every flag's default from ``Settings.from_env()``), by the in-process API
(``Server(Settings(...))``) and by the environment: ``FLOWSERVE_<FIELD>`` for a plain field
(``FLOWSERVE_HTTP_PORT=9000``, ``FLOWSERVE_ALLOW_SHM=false``) and
``FLOWSERVE_REPOSITORY_<FIELD>`` for one of the repository's (``FLOWSERVE_REPOSITORY_CONTROL_MODE=poll``);
a command-line flag wins over the environment. The repository's part is its own object
(:class:`~flowserve.repository.settings.RepositorySettings`) because the repository layer and
the in-process :class:`~flowserve.Engine` read it without the server around them; nothing reads
configuration from a module global or a context variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from flowserve.cluster.affinity import MODES as CPU_AFFINITY_MODES
from flowserve.core.errors import InvalidArgument
from flowserve.core.limits import Limits
from flowserve.dataplane.access import Restrictions
from flowserve.dataplane.admission import DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT_PER_MODEL
from flowserve.dataplane.guard import (
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_MAX_UNSENT_BYTES,
)
from flowserve.dataplane.headers import HeaderPattern
from flowserve.repository.settings import RepositorySettings

if TYPE_CHECKING:
    from flowserve.frontends.grpc.tls import GrpcTls
    from flowserve.nodes.ratelimit import ResourceLimit
    from flowserve.observability.traceconfig import TraceConfig

ENV_PREFIX = "FLOWSERVE_"


@dataclass
class Settings:
    model_repositories: list[Path | str] = field(default_factory=list)  # str: a URL (s3://...)
    graph_dirs: list[Path | str] = field(default_factory=list)  # str: a URL (s3://...)
    # control mode, poll interval, response cache, load threads, inline threshold, remote mirrors
    repository: RepositorySettings = field(default_factory=RepositorySettings)
    # worker processes (--workers; flowserve/cluster/): 1 is one process, as before
    workers: int = 1
    # --cpu-affinity (CPU_AFFINITY_MODES): "spread" holds each worker to its own share of the
    # cores (flowserve/cluster/affinity.py); "none" lets the kernel move them
    cpu_affinity: str = "none"
    host: str = "0.0.0.0"
    http_port: int = 8000  # negative: no listener (each of the three)
    grpc_port: int = 8001
    metrics_port: int = 8002
    # the OpenAI-compatible front end (flowserve/frontends/openai/, --openai-port); negative: off
    openai_port: int = -1
    # client system shared memory, on as in Triton (--allow-shm=false, or restrict the
    # shared-memory API category with --http-restricted-api / --grpc-restricted-protocol)
    allow_shm: bool = True
    # Triton's --strict-readiness: the server is not ready while a model or graph it was asked to
    # load is unavailable (failed); false: ready once it serves, whatever failed
    strict_readiness: bool = True
    # Triton's --exit-on-error: end the server (status 1) when a model or graph fails to load at
    # start. Off here (Triton: on): what loaded keeps serving, and with strict readiness the
    # server reports not ready, so an orchestrator still sees the failure
    exit_on_error: bool = False
    limits: Limits = field(default_factory=Limits)
    shutdown_grace_s: float = 30.0
    # open connections per listener, and request bytes in memory across all requests (guard.py)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_buffered_request_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    # open connections per listener from one peer address (idle ones are evicted first), and
    # response bytes encoded but not yet taken by their clients, across all connections
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    max_unsent_response_bytes: int = DEFAULT_MAX_UNSENT_BYTES
    # --log-file: the only way to set the log file (the logging API cannot change file locations)
    log_file: str = ""
    # connection timeouts (seconds; 0: none): HTTP keep-alive idle and request head, HTTP body
    # progress, gRPC handshake (TLS, preface, first SETTINGS) and gRPC idle (no stream, no frame)
    http_idle_timeout_s: float = 75.0
    http_body_timeout_s: float = 30.0
    grpc_handshake_timeout_s: float = 10.0
    grpc_idle_timeout_s: float = 300.0
    grpc_body_timeout_s: float = 30.0  # a gRPC request message making no progress (as HTTP's body)
    http_max_json_bytes: int | None = None  # None: 32 MiB (frontends/http/app.py)
    max_inflight_requests: int = DEFAULT_MAX_IN_FLIGHT
    max_inflight_per_model: int = DEFAULT_MAX_IN_FLIGHT_PER_MODEL
    http_restrictions: Restrictions = field(default_factory=Restrictions)
    grpc_restrictions: Restrictions = field(default_factory=Restrictions)
    grpc_server: str = "native"  # flowserve.frontends.GRPC_SERVERS
    grpc_tls: GrpcTls | None = None  # --grpc-use-ssl (frontends/grpc/tls.py)
    grpc_response_compression: str = "none"  # --grpc-infer-response-compression-level
    http_server: str = "native"  # flowserve.frontends.HTTP_SERVERS
    # Triton's rate limiter (nodes/ratelimit.py)
    rate_limit: str = "off"
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)
    # "http"/"grpc" -> headers forwarded as request parameters (dataplane/headers.py)
    header_forward: dict[str, HeaderPattern] = field(default_factory=dict)
    # --trace-config: start-up trace settings, and the OTLP export in opentelemetry mode
    trace_config: TraceConfig | None = None
    # --ray-address: the Ray cluster KIND_RAY instances run on ("": none; "auto": this machine's,
    # or a new local one). Handed to the repository (``repository.ray_address``) when set here
    ray_address: str = ""

    def __post_init__(self) -> None:
        if self.cpu_affinity not in CPU_AFFINITY_MODES:  # argparse checks the flag, not this default
            raise InvalidArgument(
                f"--cpu-affinity (or FLOWSERVE_CPU_AFFINITY): expected one of "
                f"{', '.join(CPU_AFFINITY_MODES)}, got {self.cpu_affinity!r}"
            )
        if self.ray_address and self.ray_address != self.repository.ray_address:
            self.repository = dataclasses.replace(self.repository, ray_address=self.ray_address)
        elif not self.ray_address:
            self.ray_address = self.repository.ray_address

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults with the ``FLOWSERVE_*`` variables of ``environ`` (default: the process's)
        applied; a value that does not parse is an InvalidArgument naming the variable."""
        environ = os.environ if environ is None else environ
        repository = RepositorySettings(**_from_env(RepositorySettings, environ, ENV_PREFIX + "REPOSITORY_"))
        return cls(repository=repository, **_from_env(cls, environ, ENV_PREFIX))


def _from_env(cls: type[Any], environ: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """The plain (int, float, str, bool) fields of dataclass ``cls`` found in ``environ``."""
    # the types only named for type checking stand for Any here: they are not plain anyway
    hints = get_type_hints(cls, localns={"ResourceLimit": Any, "TraceConfig": Any, "GrpcTls": Any})
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name.upper()
        if key not in environ:
            continue
        text, hint = environ[key].strip(), hints[f.name]
        try:
            if hint is bool:
                out[f.name] = _bool(text)
            elif hint in (int, float, str):
                out[f.name] = hint(text)
            elif hint == int | None:
                out[f.name] = int(text) if text else None
            else:
                raise InvalidArgument(f"{key}: '{f.name}' cannot be set from the environment (use the flag)")
        except ValueError:
            wanted = getattr(hint, "__name__", str(hint))
            raise InvalidArgument(f"{key}={environ[key]!r}: expected {wanted}") from None
    return out


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


__all__ = ["ENV_PREFIX", "Settings"]
