"""OpenAI requests to the data plane's requests, and the plane's responses to OpenAI's objects
(pure: no I/O)."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.core.errors import ErrorCode, FlowserveError, InvalidArgument
from flowserve.core.types import InferRequest, InferResponse

# request keys handed to the node's sampling parameters (as Triton's vLLM backend reads them)
# (``top_k``, ``ignore_eos``, ``stop_token_ids``, ``include_stop_str_in_output``: vLLM's extras)
SAMPLING = (
    "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "stop_token_ids",
    "include_stop_str_in_output",
)  # fmt: skip
MAX_N = 16
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (and completions' logprobs) at most


@dataclass(slots=True)
class Completion:
    """One completion request, read: ``prompt`` text or chat ``messages``."""

    model: str
    chat: bool
    stream: bool
    n: int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    include_usage: bool = False
    id: str = ""
    created: int = 0
    logprobs: int | None = None  # None: not asked; N: each token's and the N most likely


def _logprobs_asked(body: dict[str, Any], chat: bool) -> int | None:
    """What a request asks of log-probabilities: chat ``logprobs`` true with ``top_logprobs`` N,
    completions ``logprobs`` N."""
    if chat:
        top = body.get("top_logprobs")
        if not body.get("logprobs"):
            if top is not None:
                raise InvalidArgument("'top_logprobs' needs 'logprobs': true")
            return None
        value, name = (0 if top is None else top), "top_logprobs"
    else:
        value, name = body.get("logprobs"), "logprobs"
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidArgument(f"'{name}' must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {value!r}")
    return value


def read_completion(body: Any, chat: bool) -> Completion:
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidArgument("'model' is required (a model or graph name)")
    n = body.get("n", 1) if body.get("n") is not None else 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidArgument(f"'n' must be an integer from 1 to {MAX_N}, got {n!r}")
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    sampling = {k: body[k] for k in SAMPLING if body.get(k) is not None}
    if chat and body.get("max_completion_tokens") is not None:
        sampling["max_tokens"] = body["max_completion_tokens"]
    logprobs = _logprobs_asked(body, chat)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    prefix = "chatcmpl" if chat else "cmpl"
    req = Completion(
        model=model,
        chat=chat,
        stream=stream,
        n=n,
        sampling=sampling,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        id=f"{prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
        logprobs=logprobs,
    )
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise InvalidArgument("'messages' must be a non-empty list of message objects")
        req.messages = [_message(m) for m in messages]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise InvalidArgument("'prompt' must be a non-empty string (one prompt per request)")
        req.prompt = prompt
    return req


def _message(m: dict[str, Any]) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = "".join(parts)
    if not isinstance(m.get("role"), str) or not isinstance(content, str):
        raise InvalidArgument("each message needs a 'role' and a text 'content'")
    return {"role": m["role"], "content": content}


def plane_request(req: Completion, inputs: Sequence[str], index: int = 0) -> InferRequest:
    """The plane's request for choice ``index``; ``inputs``: the model's input names (only those
    it has are sent). With a ``seed``, choice i samples with seed + i (as vLLM seeds the n
    sequences of one request), so the n choices differ and each is repeatable."""
    have = set(inputs)
    if "text_input" not in have:
        raise InvalidArgument(f"model '{req.model}' has no 'text_input' input: it is not a generation model")
    if req.chat and "messages" not in have:
        raise InvalidArgument(f"model '{req.model}' has no 'messages' input: use /v1/completions")
    tensors: dict[str, np.ndarray] = {
        "text_input": np.array([(req.prompt or "").encode()], dtype=object),
    }
    if req.messages is not None:
        tensors["messages"] = np.array([json.dumps(req.messages).encode()], dtype=object)
    optional = {
        "stream": np.array([True]),
        "sampling_parameters": np.array([json.dumps(_choice_sampling(req, index)).encode()], dtype=object),
        "return_finish_reason": np.array([True]),
        "return_num_input_tokens": np.array([True]),
        "return_num_output_tokens": np.array([True]),
    }
    if req.logprobs is not None:
        optional["return_logprobs"] = np.array([True])
    tensors.update({k: v for k, v in optional.items() if k in have})
    return InferRequest(model=req.model, inputs=tensors)


def _choice_sampling(req: Completion, index: int) -> dict[str, Any]:
    seed = req.sampling.get("seed")
    if index and isinstance(seed, int) and not isinstance(seed, bool):
        return {**req.sampling, "seed": seed + index}
    return req.sampling


@dataclass(slots=True)
class Piece:
    """What one response of the plane adds to a choice."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    output_tokens: int
    # the node's logprobs output: per token {"<id>": {"logprob", "rank", "decoded_token"}}
    logprobs: list[dict[str, dict[str, Any]]] | None = None


def piece(response: InferResponse) -> Piece:
    out = response.outputs
    text = _first(out.get("text_output"))
    reason = _first(out.get("finish_reason"))
    prompt = out.get("num_input_tokens")
    tokens = out.get("num_output_tokens")
    entries = _first(out.get("logprobs"))
    return Piece(
        logprobs=json.loads(entries) if isinstance(entries, str) and entries else None,
        text=text if isinstance(text, str) else "",
        # Triton's vLLM backend says "None" until the last response
        finish_reason=reason if isinstance(reason, str) and reason not in ("", "None") else None,
        prompt_tokens=int(np.asarray(prompt).reshape(-1)[0]) if prompt is not None else None,
        output_tokens=int(np.asarray(tokens).reshape(-1).sum()) if tokens is not None else 0,
    )


def _first(array: np.ndarray | None) -> Any:
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if not flat.size:
        return ""
    value = flat[0]
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@dataclass(slots=True)
class Choice:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    logprobs: list[dict[str, dict[str, Any]]] | None = None

    def add(self, p: Piece) -> None:
        if p.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(p.logprobs)  # (not list + list: a copy per streamed piece)
        self.text += p.text
        self.finish_reason = p.finish_reason or self.finish_reason
        if p.prompt_tokens is not None:
            self.prompt_tokens = p.prompt_tokens
        self.output_tokens += p.output_tokens


def usage(choices: Sequence[Choice]) -> dict[str, int]:
    prompt = choices[0].prompt_tokens if choices else 0
    completion = sum(c.output_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_object(req: Completion, choices: Sequence[Choice]) -> dict[str, Any]:
    if req.chat:
        body = [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": openai_logprobs(req, c.logprobs, 0),
                "finish_reason": c.finish_reason or "stop",
            }
            for i, c in enumerate(choices)
        ]
    else:
        body = [
            {
                "index": i,
                "text": c.text,
                "logprobs": openai_logprobs(req, c.logprobs, 0),
                "finish_reason": c.finish_reason or "stop",
            }
            for i, c in enumerate(choices)
        ]
    return {
        "id": req.id,
        "object": "chat.completion" if req.chat else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": body,
        "usage": usage(choices),
    }


def openai_logprobs(
    req: Completion, entries: list[dict[str, dict[str, Any]]] | None, offset: int
) -> dict[str, Any] | None:
    """The node's logprobs entries in OpenAI's shape: chat ``{"content": [{"token", "logprob",
    "bytes", "top_logprobs"}]}``, completions ``{"tokens", "token_logprobs", "top_logprobs",
    "text_offset"}`` (``offset``: where the entries' text starts in the choice's text); None when
    the request did not ask (or the model has no log-probabilities)."""
    if req.logprobs is None or entries is None:
        return None
    most = req.logprobs
    picked = []
    for entry in entries:
        values = list(entry.values())  # the token first, then the most likely
        top = sorted((v for v in values if v["rank"] <= most), key=lambda v: v["rank"])
        picked.append((values[0], top))
    if req.chat:
        return {
            "content": [
                {
                    **_chat_token(own),
                    "top_logprobs": [_chat_token(v) for v in top],
                }
                for own, top in picked
            ]
        }
    offsets = []
    for own, _ in picked:
        offsets.append(offset)
        offset += len(own["decoded_token"])
    return {
        "tokens": [own["decoded_token"] for own, _ in picked],
        "token_logprobs": [own["logprob"] for own, _ in picked],
        "top_logprobs": [{v["decoded_token"]: v["logprob"] for v in top} for _, top in picked],
        "text_offset": offsets,
    }


def _chat_token(value: dict[str, Any]) -> dict[str, Any]:
    text = value["decoded_token"]
    return {"token": text, "logprob": value["logprob"], "bytes": list(text.encode())}


def chunk_object(
    req: Completion, index: int, p: Piece | None, first: bool, offset: int = 0
) -> dict[str, Any]:
    """One streamed chunk for choice ``index`` (``p`` None: the opening chunk of a chat choice,
    which carries the role; ``offset``: where its text starts in the choice's text)."""
    reason = p.finish_reason if p is not None else None
    logprobs = openai_logprobs(req, p.logprobs, offset) if p is not None else None
    if req.chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if p is not None and p.text:
            delta["content"] = p.text
        elif first:
            delta["content"] = ""
        choice: dict[str, Any] = {"index": index, "delta": delta}
        choice.update(logprobs=logprobs, finish_reason=reason)
    else:
        choice = {"index": index, "text": p.text if p else "", "logprobs": logprobs, "finish_reason": reason}
    return {
        "id": req.id,
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": [choice],
    }


def usage_chunk(req: Completion, choices: Sequence[Choice]) -> dict[str, Any]:
    return {
        "id": req.id,
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": [],
        "usage": usage(choices),
    }


# --- embeddings ---


def read_embeddings(body: Any) -> tuple[str, list[str], str]:
    """(model, texts, encoding): ``encoding_format`` "float" (JSON numbers) or "base64" (the
    vector's little-endian float32 bytes, what the official client asks for by default)."""
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidArgument("'model' is required (a model or graph name)")
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidArgument("'input' must be a string or a non-empty list of strings")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidArgument(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}")
    return model, texts, encoding


def embedding_request(model: str, text: str, meta: Mapping[str, Any]) -> tuple[InferRequest, str]:
    """The plane's request for one text, and the output holding the vector: the model's one
    BYTES input and its first numeric output."""
    text_inputs = [t for t in meta["inputs"] if t["datatype"] == "BYTES"]
    if len(text_inputs) != 1 or len(meta["inputs"]) != 1:
        raise InvalidArgument(
            f"model '{model}' must have exactly one input, of datatype BYTES, for embeddings"
        )
    numeric = [o for o in meta["outputs"] if o["datatype"] not in ("BYTES", "BOOL")]
    if not numeric:
        raise InvalidArgument(f"model '{model}' has no numeric output to serve as the embedding")
    spec = text_inputs[0]
    shape = [1] * max(len(spec["shape"]), 1)
    array = np.array([text.encode()], dtype=object).reshape(shape)
    return InferRequest(model=model, inputs={spec["name"]: array}), numeric[0]["name"]


def embedding_object(
    model: str, vectors: Sequence[np.ndarray], tokens: int, encoding: str = "float"
) -> dict[str, Any]:
    return {
        "object": "list",
        "model": model,
        "data": [
            {"object": "embedding", "index": i, "embedding": _encoded(v, encoding)}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").reshape(-1).tobytes()).decode()
    return np.asarray(vector, dtype=np.float64).reshape(-1).tolist()


# --- errors ---

# flowserve's codes -> (HTTP status, OpenAI error type)
ERRORS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_ARG: (400, "invalid_request_error"),
    ErrorCode.NOT_FOUND: (404, "not_found_error"),
    ErrorCode.UNSUPPORTED: (400, "invalid_request_error"),
    ErrorCode.UNAVAILABLE: (503, "service_unavailable_error"),
    ErrorCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    ErrorCode.ALREADY_EXISTS: (409, "invalid_request_error"),
    ErrorCode.CANCELLED: (499, "cancelled"),
}


def error_object(exc: BaseException) -> tuple[int, dict[str, Any]]:
    if isinstance(exc, FlowserveError):
        status, kind = ERRORS.get(exc.code, (500, "internal_error"))
        message = exc.message
        code = exc.code.value
    else:
        status, kind, message, code = 500, "internal_error", f"{type(exc).__name__}: {exc}", "INTERNAL"
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}
