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
``bsp_max_export_batch_size`` configure the export (see ``otel.py``; OpenTelemetry's
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_BSP_*`` environment variables apply first).
Anything else is a ValueError naming the item.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flowserve.observability.otel import OtelOptions

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
_BSP = {
    "bsp_max_queue_size": "max_queue_size",
    "bsp_schedule_delay": "schedule_delay_ms",
    "bsp_max_export_batch_size": "max_export_batch_size",
}


@dataclass
class TraceConfig:
    settings: dict[str, Any] = field(default_factory=dict)
    otel: OtelOptions | None = None


def _integer(item: str, text: str, least: int) -> str:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--trace-config {item}: expected an integer") from None
    if value < least:
        raise ValueError(f"--trace-config {item}: must be at least {least}")
    return str(value)


def parse_trace_config(items: Iterable[str]) -> TraceConfig:
    config = TraceConfig()
    settings = config.settings
    otel = OtelOptions()  # OpenTelemetry's environment variables first, when the mode is chosen
    otel_items: list[tuple[str, str, str]] = []
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
            _apply(otel, item, key, value)  # checked now, applied again over the environment's
            otel_items.append((item, key, value))
            continue
        if key in ("file", "log-frequency", "log_frequency"):
            if key == "file":
                settings["trace_file"] = value
            else:
                settings["log_frequency"] = _integer(item, value, 0)
        elif mode:  # triton,<anything else>
            raise ValueError(f"--trace-config {item}: unknown triton setting '{key}'")
        elif key == "level":
            if value.upper() not in LEVELS:
                raise ValueError(f"--trace-config {item}: level must be one of {', '.join(LEVELS)}")
            levels.append(value.upper())
        elif key == "rate":
            settings["trace_rate"] = _integer(item, value, 0)
        elif key == "count":
            settings["trace_count"] = _integer(item, value, -1)
        elif key == "mode":
            if value not in MODES:
                raise ValueError(f"--trace-config {item}: mode must be triton or opentelemetry")
            settings["trace_mode"] = value
        else:
            raise ValueError(f"--trace-config {item}: unknown setting '{key}'")
    if levels:
        settings["trace_level"] = [lv for lv in levels if lv != "OFF"] or ["OFF"]
    if settings.get("trace_mode") == "opentelemetry":
        otel = OtelOptions.from_env()
        for item, key, value in otel_items:
            _apply(otel, item, key, value)
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


__all__ = ["LEVELS", "MODES", "TraceConfig", "parse_trace_config"]
