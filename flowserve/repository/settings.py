"""How the repository is served: the settings the repository layer reads, with their defaults.

These defaults are the only ones: the server's :class:`flowserve.settings.Settings` holds one of
these (``settings.repository``), the command line takes its defaults from it, and the in-process
:class:`flowserve.Engine` takes one too. Model control modes are Triton's:

- ``none`` (Triton's default): load everything at start; the load and unload API is refused;
- ``explicit``: load only ``load_models`` at start (``"*"``: all), then change only through the
  load and unload API;
- ``poll``: load everything, and re-scan every ``poll_secs``: load what was added or changed,
  unload what was removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowserve.core.errors import InvalidArgument
from flowserve.repository.remote import RemoteOptions

CONTROL_MODES = ("none", "explicit", "poll")


@dataclass(frozen=True)
class RepositorySettings:
    control_mode: str = "none"
    load_models: tuple[str, ...] = ()  # explicit mode: what to load at start ("*": all)
    poll_secs: float = 15.0
    cache_bytes: int = 0  # the response cache (0: none); models opt in
    # models loaded at once, and instances of one model loaded at once (when its backend allows)
    model_load_threads: int = 4
    # Python work runs on the event loop while its calls take less than this (0: on threads)
    inline_threshold_us: float = 1000.0
    remote: RemoteOptions = field(default_factory=RemoteOptions)  # remote repositories (s3://...)
    # the Ray cluster KIND_RAY instances run on ("" none; "auto" this machine's, or a new local
    # one; "local" a new local one; else an address): nodes/rayinstances.py
    ray_address: str = ""
    # a node's failure carries the traceback of its Python code in the error response's message
    # too (the log always has it); off by default: a client sees no server file paths
    error_traceback: bool = False

    def __post_init__(self) -> None:
        if self.control_mode not in CONTROL_MODES:
            raise InvalidArgument(f"model control mode must be one of {', '.join(CONTROL_MODES)}")
        if self.model_load_threads < 1:
            raise InvalidArgument("the model load thread count must be >= 1")
        if self.poll_secs <= 0:
            raise InvalidArgument("the repository poll interval must be > 0 seconds")
        if self.inline_threshold_us < 0:
            raise InvalidArgument("the inline threshold must be >= 0 microseconds")

    def loads_at_start(self) -> set[str] | None:
        """The names loaded at start; None: everything."""
        if self.control_mode != "explicit" or "*" in self.load_models:
            return None
        return set(self.load_models)
