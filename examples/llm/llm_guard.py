"""Nodes of the guarded chat graph (graphs/guarded_chat.yaml): a classifier that routes a
prompt either to the LLM or to a canned answer, and a post-processor that edits the LLM's token
stream before the client sees it. Every LLM response (a piece of text) passes through
``Redact`` on its own, as it is generated."""

from __future__ import annotations

from typing import Any

import numpy as np


def _text(array: np.ndarray) -> str:
    value = np.asarray(array).reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


class Classify:
    """score 1.0 when the prompt names a blocked topic (parameter ``blocked``, comma-separated),
    else 0.0; also ``stream`` (true: the LLM answers token by token)."""

    inputs = ["text_input"]
    outputs = ["score", "stream"]

    def initialize(self, config: dict[str, Any]) -> None:
        blocked = str(config["parameters"].get("blocked", ""))
        self.blocked = [w.strip().lower() for w in blocked.split(",") if w.strip()]

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prompt = _text(inputs["text_input"]).lower()
        hit = any(word in prompt for word in self.blocked)
        return {"score": np.array([1.0 if hit else 0.0], np.float32), "stream": np.array([True])}


class Canned:
    """The answer to a blocked prompt (parameter ``answer``), without running the LLM."""

    inputs = ["text_input"]
    outputs = ["text_output"]

    def initialize(self, config: dict[str, Any]) -> None:
        self.answer = str(config["parameters"].get("answer", "I can't help with that."))

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"text_output": np.array([self.answer.encode()], dtype=object)}


class Redact:
    """Each streamed piece of text with the banned words (parameter ``banned``) masked."""

    inputs = ["text_output"]
    outputs = ["text_output"]

    def initialize(self, config: dict[str, Any]) -> None:
        banned = str(config["parameters"].get("banned", ""))
        self.banned = [w.strip() for w in banned.split(",") if w.strip()]

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        text = _text(inputs["text_output"])
        for word in self.banned:
            text = text.replace(word, "*" * len(word))
        return {"text_output": np.array([text.encode()], dtype=object)}
