"""Request headers forwarded as request parameters (Triton's ``--http-header-forward-pattern``
and ``--grpc-header-forward-pattern``): a header (HTTP) or metadata key (gRPC) whose name
matches the pattern becomes a request parameter of that (lower-case) name, so whatever reads
parameters (a split node's ``by_parameter`` or ``sticky_parameter``, a Python node through its
context) can read it. Parameters the request sets itself win over forwarded headers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


def forward_headers(
    parameters: dict[str, Any], headers: Iterable[tuple[str | bytes, str | bytes]], pattern: re.Pattern[str]
) -> None:
    """Add the headers whose name matches ``pattern`` (searched, case-insensitive names) to
    ``parameters``, as strings, unless the request already has a parameter of that name."""
    for raw_name, raw_value in headers:
        name = (raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name).lower()
        if name in parameters or not pattern.search(name):
            continue
        parameters[name] = raw_value.decode("latin-1") if isinstance(raw_value, bytes) else raw_value


def also_forward(pattern: re.Pattern[str] | None, name: str) -> re.Pattern[str]:
    """``pattern`` (None: nothing) widened to forward the header ``name`` too."""
    exact = f"^{re.escape(name)}$"
    return re.compile(f"(?:{pattern.pattern})|{exact}" if pattern else exact, re.IGNORECASE)


def compile_pattern(text: str, option: str) -> re.Pattern[str]:
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"{option}: invalid regular expression {text!r}: {exc}") from None


__all__ = ["also_forward", "compile_pattern", "forward_headers"]
