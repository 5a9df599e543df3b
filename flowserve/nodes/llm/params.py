"""``model.json`` (the engine's arguments) and a request's sampling parameters, parsed and
checked once per load or request. Pure: no engine imports, every error names the model and
the field."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.core.errors import InvalidArgument
from flowserve.nodes.llm.engine import Sampling

ENGINES = ("auto", "transformers", "vllm")
# keys of model.json that flowserve reads itself, for every engine
OWN_KEYS = frozenset({"engine", "max_tokens", "max_waiting"})
# what the transformers engine reads from model.json (everything else is an engine argument of
# vLLM's, ignored there with a warning)
TRANSFORMERS_KEYS = frozenset(
    {
        "model",
        "tokenizer",
        "gguf_file",
        "dtype",
        "device",
        "seed",
        "page_size",
        "num_blocks",
        "max_batch_tokens",
        "max_requests_per_batch",
        "max_model_len",
        "trust_remote_code",
    }
)
DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_WAITING = 1024


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """A generation model's ``model.json``: which engine, its arguments, flowserve's defaults.
    ``model`` is resolved against the version directory when it names a path there."""

    engine: str
    args: dict[str, Any]
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_waiting: int = DEFAULT_MAX_WAITING
    ignored: tuple[str, ...] = field(default=())


def read_model_json(model: str, version_dir: Path) -> EngineConfig:
    path = version_dir / "model.json"
    if not path.is_file():
        raise InvalidArgument(f"model '{model}': {path} is missing (it holds the engine's arguments)")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"model '{model}': {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"model '{model}': {path} must hold a JSON object")
    return engine_config(model, doc, version_dir)


def engine_config(model: str, doc: Mapping[str, Any], version_dir: Path) -> EngineConfig:
    engine = str(doc.get("engine", "auto"))
    if engine not in ENGINES:
        raise InvalidArgument(
            f"model '{model}': model.json 'engine' is '{engine}'; expected one of {', '.join(ENGINES)}"
        )
    if not isinstance(doc.get("model"), str) or not doc["model"]:
        raise InvalidArgument(
            f"model '{model}': model.json needs 'model' (a local path or a cached model id)"
        )
    args = {k: v for k, v in doc.items() if k not in OWN_KEYS}
    for key in ("model", "tokenizer"):
        value = args.get(key)
        if isinstance(value, str) and (version_dir / value).exists():
            args[key] = str((version_dir / value).resolve())
    max_tokens = _positive_int(model, "max_tokens", doc.get("max_tokens", DEFAULT_MAX_TOKENS))
    max_waiting = _positive_int(model, "max_waiting", doc.get("max_waiting", DEFAULT_MAX_WAITING))
    ignored = tuple(sorted(k for k in args if k not in TRANSFORMERS_KEYS))
    return EngineConfig(engine, args, max_tokens, max_waiting, ignored)


def _positive_int(model: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(
            f"model '{model}': model.json '{key}' must be a positive integer, got {value!r}"
        )
    return value


# sampling keys and their types; strings are converted (Triton's vLLM backend takes "0.5" too)
SAMPLING_KEYS: dict[str, type] = {
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "seed": int,
    "stop": list,
    "ignore_eos": bool,
    "logprobs": int,
    "include_stop_str_in_output": bool,
    "stop_token_ids": tuple,
}
MAX_LOGPROBS = 20  # the most alternatives a token may report (vLLM's default max_logprobs)
# sampling keys of vLLM's that this engine layer does not apply (refused, not silently dropped)
UNSUPPORTED_KEYS = frozenset(
    {
        "n",
        "best_of",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "min_tokens",
        "prompt_logprobs",
        "use_beam_search",
        "length_penalty",
        "bad_words",
        "logit_bias",
        "allowed_token_ids",
        "guided_decoding",
        "structured_outputs",
        "lora_name",
    }
)


def sampling_from(
    model: str, doc: Mapping[str, Any], default_max_tokens: int, strict: bool, where: str
) -> Sampling:
    """A request's :class:`Sampling` from a mapping of vLLM-style keys. ``strict``: an unknown
    key is an error (the ``sampling_parameters`` input); else ignored (request parameters also
    carry the transport's own). ``where`` names the source in messages."""
    values: dict[str, Any] = {"max_tokens": default_max_tokens}
    for key, raw in doc.items():
        kind = SAMPLING_KEYS.get(key)
        if kind is None:
            if key in UNSUPPORTED_KEYS and raw is not None:
                raise InvalidArgument(
                    f"model '{model}': {where} '{key}' is not supported by flowserve's generation node"
                )
            if strict and key not in UNSUPPORTED_KEYS:
                known = ", ".join(SAMPLING_KEYS)
                raise InvalidArgument(f"model '{model}': unknown {where} '{key}' (known: {known})")
            continue
        if raw is None:
            continue
        values[key] = _convert(model, where, key, kind, raw)
    sampling = Sampling(
        max_tokens=values["max_tokens"],
        temperature=values.get("temperature", 1.0),
        top_p=values.get("top_p", 1.0),
        top_k=values.get("top_k", 0),
        seed=values.get("seed"),
        stop=tuple(values.get("stop", ())),
        ignore_eos=values.get("ignore_eos", False),
        logprobs=values.get("logprobs"),
        include_stop=values.get("include_stop_str_in_output", False),
        stop_token_ids=values.get("stop_token_ids", ()),
    )
    check_sampling(model, sampling, where)
    return sampling


def _convert(model: str, where: str, key: str, kind: type, raw: Any) -> Any:
    bad = InvalidArgument(f"model '{model}': {where} '{key}' must be {kind.__name__}, got {raw!r}")
    if kind is tuple:  # token ids
        ids = raw if isinstance(raw, list) else [None]
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            return tuple(ids)
        raise InvalidArgument(f"model '{model}': {where} '{key}' must be a list of token ids (integers >= 0)")
    if kind is list:
        if isinstance(raw, str):
            return [raw]
        if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
            return raw
        raise InvalidArgument(f"model '{model}': {where} '{key}' must be a string or a list of strings")
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise bad
    if isinstance(raw, bool):
        raise bad
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise bad from None
    if kind is int and isinstance(raw, float) and raw != value:
        raise bad
    return value


def check_sampling(model: str, s: Sampling, where: str) -> None:
    problems = []
    if s.max_tokens <= 0:
        problems.append(f"'max_tokens' must be > 0, got {s.max_tokens}")
    if not math.isfinite(s.temperature) or s.temperature < 0:
        problems.append(f"'temperature' must be >= 0, got {s.temperature}")
    if not math.isfinite(s.top_p) or not 0 < s.top_p <= 1:
        problems.append(f"'top_p' must be in (0, 1], got {s.top_p}")
    if s.top_k < 0 and s.top_k != -1:
        problems.append(f"'top_k' must be >= 0 (or -1: off), got {s.top_k}")
    if any(not stop for stop in s.stop):
        problems.append("'stop' strings must not be empty")
    if s.logprobs is not None and not 0 <= s.logprobs <= MAX_LOGPROBS:
        problems.append(f"'logprobs' must be in 0..{MAX_LOGPROBS}, got {s.logprobs}")
    if problems:
        raise InvalidArgument(f"model '{model}': {where}: " + "; ".join(problems))


def parse_json_parameters(model: str, text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise InvalidArgument(f"model '{model}': {where} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"model '{model}': {where} must be a JSON object")
    return doc
