"""Restricted APIs, as Triton has them (``--http-restricted-api`` / ``--grpc-restricted-protocol``).

An operator puts API categories in groups, each guarded by a header key and value::

    --http-restricted-api=model-repository,shared-memory,trace,logging:admin-key=s3cret
    --grpc-restricted-protocol=model-repository,shared-memory,trace,logging:admin-key=s3cret

A request to a restricted category must carry that header with exactly that value: over HTTP
the header is ``admin-key``, over gRPC the metadata key is ``triton-grpc-protocol-admin-key``
(Triton's prefix). Otherwise HTTP answers 403 and gRPC UNAVAILABLE (as Triton does), naming the
header expected, never the value. A category may be in one group only. Nothing is restricted
unless configured; an unrestricted server pays nothing per request.

This module is the transport-neutral part (the categories, the groups and the refusal); which
category a request falls in is decided by each front end from its own route table
(``frontends/http/app.py`` by path, ``frontends/grpc/access.py`` by rpc).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True, slots=True)
class Restriction:
    header: str  # lower case, as ASGI and gRPC metadata deliver header names
    value: str

    def allows(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.value.encode())


class Restrictions:
    """Which categories need which header; empty when nothing is restricted."""

    def __init__(self, groups: dict[str, Restriction] | None = None) -> None:
        self.by_category: dict[str, Restriction] = dict(groups or {})

    def __bool__(self) -> bool:
        return bool(self.by_category)

    @classmethod
    def parse(cls, specs: Sequence[str], header_prefix: str = "") -> Restrictions:
        """From ``"cat1,cat2:key=value"`` strings (ValueError naming the problem)."""
        groups: dict[str, Restriction] = {}
        for spec in specs:
            apis, sep, pair = spec.partition(":")
            key, eq, value = pair.partition("=")
            if not sep or not eq or not key.strip() or not apis.strip():
                raise ValueError(f"restricted API group '{spec}' must read '<api>[,<api>...]:<key>=<value>'")
            restriction = Restriction(header_prefix + key.strip().lower(), value)
            for api in (a.strip() for a in apis.split(",")):
                if api not in CATEGORIES:
                    raise ValueError(f"unknown API '{api}' in '{spec}' (known: {', '.join(CATEGORIES)})")
                if api in groups:
                    raise ValueError(f"API '{api}' is in more than one restricted group")
                groups[api] = restriction
        return cls(groups)

    def denial(self, category: str | None, header: Callable[[str], str | None]) -> str | None:
        """None when the request may proceed, else the message to refuse it with.
        ``header(name)`` returns the request's value of a (lower-case) header."""
        if category is None:
            return None
        restriction = self.by_category.get(category)
        if restriction is None or restriction.allows(header(restriction.header)):
            return None
        kind = "protocol" if restriction.header.startswith(GRPC_HEADER_PREFIX) else "API"
        return f"This {kind} is restricted, expecting header '{restriction.header}'"
