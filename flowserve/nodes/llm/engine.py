"""The small interface every generation engine implements, and the values that cross it.

An engine takes a prompt as token ids with :class:`Sampling` parameters and streams the new
tokens back (:meth:`Engine.generate`); closing that stream (the client went away, a stop string
matched) cancels the sequence and frees its KV blocks at once. :meth:`Engine.load` reports the
running batch and the KV cache for metrics and admission. Text lives above the engine (the
node detokenizes and applies stop strings), so engines stay interchangeable.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Sampling:
    """What one request asks of the sampler. ``temperature`` 0 is greedy; ``top_k`` 0 is off;
    ``seed``: the request draws from its own random generator, so the same prompt and seed give
    the same tokens whatever else runs in the batch (both engines); ``logprobs`` (vLLM's): None,
    no log-probabilities; N >= 0, each token's log-probability and rank and the N most likely
    tokens at its position. Log-probabilities are the model's own (the log-softmax of its logits,
    before temperature, top-k and top-p), as vLLM reports them by default."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop: bool = False  # the stop string ends the text after it, not before
    stop_token_ids: tuple[int, ...] = ()  # generating one of these ends the sequence (it is kept)


@dataclass(frozen=True, slots=True)
class Ranked:
    """A generated token's rank among the model's log-probabilities at its position (1: the most
    likely) and the most likely tokens there, (id, log-probability), most likely first."""

    rank: int
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Tokens:
    """New tokens of one sequence; ``finished`` with ``reason`` ("stop": end of sequence,
    "length": max_tokens) on the last; ``logprobs``: each new token's log-probability, when the
    request asked for them (:attr:`Sampling.logprobs`) and the engine has them; ``ranked``: each
    new token's :class:`Ranked`, likewise."""

    ids: Sequence[int]
    finished: bool = False
    reason: str | None = None
    logprobs: Sequence[float] | None = None
    ranked: Sequence[Ranked] | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """The engine's running batch and KV cache, now."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1 of the KV cache's blocks in use


class Tokenizer(Protocol):
    """What the node needs of a tokenizer (a transformers tokenizer has all of it)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class Engine(Protocol):
    """A generation engine (see the module docstring)."""

    name: str
    tokenizer: Tokenizer

    async def start(self) -> None:
        """Load the model and start the engine's loop (off the event loop)."""

    async def stop(self) -> None:
        """Stop the loop, free the KV cache and the model. Must not raise."""

    def generate(
        self, request_id: str, prompt: Sequence[int], sampling: Sampling
    ) -> AsyncGenerator[Tokens, None]:
        """The request's new tokens as they are decoded; closing the generator cancels it."""
        ...

    def load(self) -> EngineLoad:
        """The running batch and KV-cache use (cheap: read at every scrape)."""
        ...
