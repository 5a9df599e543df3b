"""Triton's ``--trace-config`` option: ``[<mode>,]<setting>=<value>``, repeatable.

::

    config = parse_trace_config(["level=TIMESTAMPS", "rate=100", "mode=opentelemetry",
                                 "opentelemetry,url=collector:4318/v1/traces"])
    config.settings   # the start-up trace settings, as the trace settings API takes them
    config.otel       # OtelOptions when the mode is opentelemetry, else None

Global settings: ``level`` (OFF, TIMESTAMPS, TENSORS; repeatable), ``rate`` (every N-th
request; 0: none sampled, so only requests that carry a ``traceparent`` are traced in
opentelemetry mode), ``count`` (-1: no limit), ``mode`` (``triton``: trace files;
``opentelemetry``: OTLP export). ``triton,file=PATH`` and ``triton,log-frequency=N`` (also
accepted without the prefix, as older Triton releases took them) set the trace file.
``opentelemetry,url=URL``, ``opentelemetry,resource=KEY=VALUE`` (repeatable) and the batch
span processor's ``bsp_max_queue_size``, ``bsp_schedule_delay`` (ms) and
``bsp_max_export_batch_size`` configure the export (see ``otel.py``). OpenTelemetry's
environment variables apply where these say nothing, as Triton documents: the options win.
Anything else is a ValueError naming the item.

This module does not import OpenTelemetry's SDK (``otel.py`` does, when the export starts).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flowserve.spec.bounds import SETTINGS, TRACE_LEVELS

DEFAULT_URL = "http://localhost:4318/v1/traces"
LEVELS = TRACE_LEVELS
MODES = ("triton", "opentelemetry")
_BSP = {
    "bsp_max_queue_size": "max_queue_size",
    "bsp_schedule_delay": "schedule_delay_ms",
    "bsp_max_export_batch_size": "max_export_batch_size",
}


# the batch span processor's settings: option name, OpenTelemetry's variable, default, least value
_BSP_ENV = {
    "max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", 2048, 1),
    "schedule_delay_ms": ("OTEL_BSP_SCHEDULE_DELAY", 5000, 0),
    "max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, 1),
}


@dataclass
class OtelOptions:
    """Triton's ``--trace-config opentelemetry,<setting>=<value>`` settings; None (or no resource
    attribute) where the options say nothing, so that OpenTelemetry's environment applies:

    - ``url``: else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``
      with ``/v1/traces`` (OTLP/HTTP), else ``DEFAULT_URL``. A ``grpc://`` (``grpcs://``: TLS) url,
      or ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL=grpc``, exports over gRPC instead.
    - ``resource``: over ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (service.name is
      "flowserve" when none of them names it).
    - the batch span processor's settings: else ``OTEL_BSP_*``, else the SDK's defaults.
    - ``timeout_s`` (not a Triton setting): else ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT``, else 10 s.
    """

    url: str | None = None
    resource: dict[str, str] = field(default_factory=dict)
    max_queue_size: int | None = None
    schedule_delay_ms: int | None = None
    max_export_batch_size: int | None = None
    timeout_s: float | None = None

    def set(self, name: str, text: str, source: str) -> None:
        """One integer batch-processor setting from ``source`` (ValueError naming it)."""
        setattr(self, name, _bsp_value(name, text, source))

    def batch_settings(self) -> tuple[int, int, int]:
        """(max queue size, schedule delay in ms, max export batch size): the options, else
        OpenTelemetry's ``OTEL_BSP_*`` variables, else the defaults (ValueError naming a bad one)."""
        values = []
        for name, (env, default, _least) in _BSP_ENV.items():
            value: int | None = getattr(self, name)
            if value is None:
                text = os.environ.get(env, "").strip()
                value = _bsp_value(name, text, env) if text else default
            values.append(value)
        return values[0], values[1], values[2]

    def transport(self) -> tuple[str, str | None]:
        """("grpc" or "http", the endpoint for the SDK's exporter: None lets it read the
        environment's, or its default)."""
        url = self.url
        if url:
            scheme, sep, rest = url.partition("://")
            if sep and scheme.lower() in ("grpc", "grpcs"):
                return "grpc", ("https://" if scheme.lower() == "grpcs" else "http://") + rest
            if not sep:  # Triton's examples give host:port/path
                url = "http://" + url
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", ""
        )
        return ("grpc" if protocol.strip().lower() == "grpc" else "http"), url

    def endpoint(self) -> str:
        """Where spans go (for messages), as the SDK's exporters resolve it."""
        protocol, url = self.transport()
        if url:
            return url
        env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if env:
            return env
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if protocol == "grpc":
            return base or "http://localhost:4317"
        return base.rstrip("/") + "/v1/traces" if base else DEFAULT_URL

    def check(self) -> None:
        queue, _delay, batch = self.batch_settings()
        if batch > queue:
            raise ValueError(
                f"bsp_max_export_batch_size ({batch}) must not exceed bsp_max_queue_size ({queue})"
            )
        if self.url and "://" not in self.url:  # Triton's examples give host:port/path
            self.url = "http://" + self.url


def _bsp_value(name: str, text: str, source: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{source}: expected an integer, got {text!r}") from None
    if value < _BSP_ENV[name][2]:
        raise ValueError(f"{source}: {value} is out of range")
    return value


@dataclass
class TraceConfig:
    settings: dict[str, Any] = field(default_factory=dict)
    otel: OtelOptions | None = None


def _integer(item: str, text: str, setting: str) -> str:
    """An integer trace setting within its bound (spec/bounds.py SETTINGS), as the trace
    settings API takes it."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--trace-config {item}: expected an integer") from None
    bound = SETTINGS[setting]
    if not bound.holds(value):
        raise ValueError(
            f"--trace-config {item}: must be between {bound.low} and {bound.high} ({bound.what})"
        )
    return str(value)


def parse_trace_config(items: Iterable[str]) -> TraceConfig:
    config = TraceConfig()
    settings = config.settings
    otel = OtelOptions()  # what the options say; OpenTelemetry's environment fills the rest
    levels: list[str] = []
    for item in items:
        head, sep, rest = item.partition(",")
        mode, setting = (head, rest) if sep and "=" not in head else ("", item)
        key, eq, value = setting.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"--trace-config {item}: expected [<mode>,]<setting>=<value>")
        if mode and mode not in MODES:
            raise ValueError(f"--trace-config {item}: unknown mode '{mode}' (triton or opentelemetry)")
        if mode == "opentelemetry":
            if key not in ("url", "resource", *_BSP):
                raise ValueError(f"--trace-config {item}: unknown opentelemetry setting '{key}'")
            _apply(otel, item, key, value)
            continue
        if key in ("file", "log-frequency", "log_frequency"):
            if key == "file":
                settings["trace_file"] = value
            else:
                settings["log_frequency"] = _integer(item, value, "log_frequency")
        elif mode:  # triton,<anything else>
            raise ValueError(f"--trace-config {item}: unknown triton setting '{key}'")
        elif key == "level":
            if value.upper() not in LEVELS:
                raise ValueError(f"--trace-config {item}: level must be one of {', '.join(LEVELS)}")
            levels.append(value.upper())
        elif key == "rate":
            settings["trace_rate"] = _integer(item, value, "trace_rate")
        elif key == "count":
            settings["trace_count"] = _integer(item, value, "trace_count")
        elif key == "mode":
            if value not in MODES:
                raise ValueError(f"--trace-config {item}: mode must be triton or opentelemetry")
            settings["trace_mode"] = value
        else:
            raise ValueError(f"--trace-config {item}: unknown setting '{key}'")
    if levels:
        settings["trace_level"] = [lv for lv in levels if lv != "OFF"] or ["OFF"]
    if settings.get("trace_mode") == "opentelemetry":
        otel.check()
        config.otel = otel
    return config


def _apply(otel: OtelOptions, item: str, key: str, value: str) -> None:
    if key == "url":
        otel.url = value
    elif key == "resource":
        name, eq, attr = value.partition("=")
        if not eq or not name:
            raise ValueError(f"--trace-config {item}: expected resource=<key>=<value>")
        otel.resource[name] = attr
    else:
        otel.set(_BSP[key], value, f"--trace-config {item}")


__all__ = ["DEFAULT_URL", "LEVELS", "MODES", "OtelOptions", "TraceConfig", "parse_trace_config"]
