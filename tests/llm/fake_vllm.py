"""A fake ``vllm`` package for CPU tests of flowserve's vLLM engine: the API surface the engine
uses, with the names, signatures and behaviour of vLLM 0.33's (read from its sources):

- ``vllm.engine.arg_utils.AsyncEngineArgs``: a dataclass of typed fields (a subset), refusing
  unknown keywords with ``TypeError`` as a dataclass does;
- ``vllm.v1.engine.async_llm.AsyncLLM``: ``from_engine_args(engine_args, start_engine_loop,
  usage_context, stat_loggers)``; ``generate(prompt, sampling_params, request_id, ...)`` an async
  generator of ``RequestOutput`` that aborts the request when closed or cancelled;
  ``abort(request_id | ids, internal=False)`` async, by external or internal id, putting a final
  ``abort`` output in the request's queue; ``get_supported_tasks()`` async; ``get_tokenizer()``
  sync; ``shutdown(timeout=None)`` sync. Its output handler starts on the first call that needs
  the event loop, as vLLM's does, and refuses to run on another loop than the one it started on;
- ``SamplingParams`` with vLLM's validation (temperature in [0, 2], top_k >= -1, stop strings
  need detokenize, n > 1 not greedy); ``RequestOutputKind`` DELTA / CUMULATIVE / FINAL_ONLY,
  with deltas merged when the consumer falls behind (vLLM's ``RequestOutputCollector``);
- stat loggers (``StatLoggerBase``; factories called with the config and the engine index)
  recorded once per step with ``SchedulerStats`` (running, waiting, skipped waiting, KV usage).

The "model" writes :data:`TEXT` one character per token (token id = the character's code; id 0 is
the end of sequence, after the text, unless ``ignore_eos``); with a temperature above 0 it draws
characters from its own generator, seeded by the request's ``seed``. Each engine step is
:data:`STEP_S` seconds.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import enum
import importlib.machinery
import itertools
import math
import random
import threading
import types
from collections.abc import AsyncGenerator, Iterable
from typing import Any, Literal, TypedDict

import pytest

TEXT = "the quick brown fox jumps over the lazy dog. "
EOS = 0
STEP_S = 0.002
BLOCK = 16  # tokens per KV block
ENGINES: list[AsyncLLM] = []  # every AsyncLLM built, the last one last


# --- vllm.exceptions, vllm.v1.engine.exceptions ---


class VLLMError(Exception):
    pass


class VLLMClientError(VLLMError):
    pass


class VLLMServerError(VLLMError):
    pass


class VLLMValidationError(VLLMClientError):
    pass


class EngineDeadError(VLLMServerError):
    pass


class EngineGenerateError(VLLMServerError):
    pass


# --- vllm.usage.usage_lib ---


class UsageContext(str, enum.Enum):  # noqa: UP042 (vLLM's is a str Enum)
    UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
    LLM_CLASS = "LLM_CLASS"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"
    ENGINE_CONTEXT = "ENGINE_CONTEXT"


# --- vllm.engine.arg_utils ---


@dataclasses.dataclass
class VllmConfig:
    model: str
    max_model_len: int
    max_num_seqs: int
    num_blocks: int
    usage_context: UsageContext
    supported_tasks: tuple[str, ...]


@dataclasses.dataclass
class EngineArgs:
    model: str = "facebook/opt-125m"
    tokenizer: str | None = None
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    seed: int = 0
    max_model_len: int | None = None
    trust_remote_code: bool = False
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    enable_lora: bool = False
    max_lora_rank: int = 16
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    disable_log_stats: bool = False
    compilation_config: dict[str, Any] | None = None
    served_model_name: str | list[str] | None = None

    def create_engine_config(self, usage_context: UsageContext | None = None) -> VllmConfig:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        # vLLM's batch defaults depend on the usage context (H100: 1024 for the OpenAI server)
        default_seqs = {UsageContext.OPENAI_API_SERVER: 1024, UsageContext.LLM_CLASS: 1024}
        return VllmConfig(
            model=self.model,
            max_model_len=self.max_model_len or 512,
            max_num_seqs=self.max_num_seqs or default_seqs.get(usage_context, 128),  # type: ignore[arg-type]
            num_blocks=64,
            usage_context=usage_context or UsageContext.ENGINE_CONTEXT,
            supported_tasks=("embed",) if "embed" in self.model else ("generate",),
        )


@dataclasses.dataclass
class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False


# --- vllm.sampling_params, vllm.inputs, vllm.outputs ---


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(
        self,
        n: int = 1,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        ignore_eos: bool = False,
        max_tokens: int | None = 16,
        min_tokens: int = 0,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        detokenize: bool = True,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
        output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE,
    ) -> None:
        self.n = n
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.seed = None if seed == -1 else seed
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.detokenize = detokenize
        self.include_stop_str_in_output = include_stop_str_in_output
        self.output_kind = output_kind
        if not isinstance(output_kind, RequestOutputKind):
            raise TypeError(f"output_kind must be a RequestOutputKind, got {output_kind!r}")
        if not math.isfinite(temperature) or not 0 <= temperature <= 2:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
        if max_tokens is not None and max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {max_tokens}.")
        if logprobs is not None and logprobs != -1 and logprobs < 0:
            raise VLLMValidationError(f"logprobs must be non-negative or -1, got {logprobs}.")
        if self.stop and not detokenize:
            raise VLLMValidationError("stop strings are only supported when detokenize is True.")
        if temperature == 0 and n > 1:
            raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {n}.")


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]
    prompt: str


class TextPrompt(TypedDict, total=False):
    prompt: str


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: Any,
        outputs: list[CompletionOutput],
        finished: bool,
        num_cached_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.num_cached_tokens = num_cached_tokens

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """vLLM's merge of a later output into this one (the consumer fell behind)."""
        self.finished |= next_output.finished
        for nxt in next_output.outputs:
            for i, completion in enumerate(self.outputs):
                if completion.index == nxt.index:
                    if aggregate:
                        completion.text += nxt.text
                        completion.token_ids = [*completion.token_ids, *nxt.token_ids]
                        if nxt.logprobs:
                            assert completion.logprobs is not None
                            completion.logprobs.extend(nxt.logprobs)
                        completion.cumulative_logprob = nxt.cumulative_logprob
                        completion.finish_reason = nxt.finish_reason
                        completion.stop_reason = nxt.stop_reason
                    else:
                        self.outputs[i] = nxt
                    break
            else:
                self.outputs.append(nxt)


# --- vllm.v1.metrics ---


@dataclasses.dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0


class StatLoggerBase(abc.ABC):
    @abc.abstractmethod
    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0): ...

    @abc.abstractmethod
    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None: ...

    @abc.abstractmethod
    def log_engine_initialized(self) -> None: ...

    def log(self) -> None:  # noqa: B027 (vLLM's base: a no-op hook)
        pass


# --- the tokenizer ---


class CharTokenizer:
    """One token per character (id = its code point), id 0 the end of sequence."""

    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if i != EOS or not skip_special_tokens)

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + "assistant: "
        return text if kwargs.get("tokenize") is False else self.encode(text)


# --- vllm.v1.engine.async_llm ---


class _Collector:
    """vLLM's RequestOutputCollector: one pending output, deltas merged while it waits."""

    def __init__(self, kind: RequestOutputKind) -> None:
        self.aggregate = kind == RequestOutputKind.DELTA
        self.output: RequestOutput | Exception | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | Exception) -> None:
        if self.output is None or isinstance(output, Exception):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, RequestOutput) and isinstance(output, RequestOutput):
            self.output.add(output, aggregate=self.aggregate)

    async def get(self) -> RequestOutput:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output


@dataclasses.dataclass
class _Request:
    internal_id: str
    external_id: str
    prompt: list[int]
    params: SamplingParams
    queue: _Collector
    generated: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    sent: int = 0  # tokens already in a DELTA output
    rng: random.Random | None = None

    @property
    def blocks(self) -> int:
        return math.ceil((len(self.prompt) + len(self.generated)) / BLOCK)


class AsyncLLM:
    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: Any,
        log_stats: bool,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        log_requests: bool = True,
        start_engine_loop: bool = True,
        stat_loggers: list[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.vllm_config = vllm_config
        self.usage_context = usage_context
        self.created_in = threading.current_thread()
        try:
            self.loop_at_init: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop_at_init = None
        self.stat_loggers = [factory(vllm_config, 0) for factory in stat_loggers or []]
        for logger in self.stat_loggers:
            logger.log_engine_initialized()
        self.tokenizer = CharTokenizer()
        self.running: dict[str, _Request] = {}
        self.waiting: dict[str, _Request] = {}
        self.aborted: list[str] = []  # external ids of aborted requests
        self.abort_calls = 0  # abort() calls, those that found nothing too
        self.params: list[SamplingParams] = []  # every request's
        self.prompts: list[Any] = []
        self.shut_down = False
        self.dead: Exception | None = None
        self.output_handler: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        ENGINES.append(self)

    @classmethod
    def from_vllm_config(
        cls,
        vllm_config: VllmConfig,
        start_engine_loop: bool = True,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[Any] | None = None,
        enable_log_requests: bool = False,
        aggregate_engine_logging: bool = False,
        disable_log_stats: bool = False,
        client_addresses: dict[str, Any] | None = None,
        client_count: int = 1,
        client_index: int = 0,
    ) -> AsyncLLM:
        return cls(
            vllm_config,
            None,
            log_stats=not disable_log_stats,
            usage_context=usage_context,
            log_requests=enable_log_requests,
            start_engine_loop=start_engine_loop,
            stat_loggers=stat_loggers,
        )

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        start_engine_loop: bool = True,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[Any] | None = None,
    ) -> AsyncLLM:
        vllm_config = engine_args.create_engine_config(usage_context)
        engine = cls(
            vllm_config,
            None,
            log_stats=not engine_args.disable_log_stats,
            usage_context=usage_context,
            log_requests=engine_args.enable_log_requests,
            start_engine_loop=start_engine_loop,
            stat_loggers=stat_loggers,
        )
        engine.engine_args = engine_args
        return engine

    # the output handler: one engine step every STEP_S, on the loop it started on

    def _run_output_handler(self) -> None:
        loop = asyncio.get_running_loop()
        if self.output_handler is not None:
            assert loop is self.loop, "vLLM's output handler runs on one event loop only"
            return
        self.loop = loop
        self.output_handler = loop.create_task(self._steps())

    async def _steps(self) -> None:
        while True:
            await asyncio.sleep(STEP_S)
            self._step()

    def _step(self) -> None:
        room = self.vllm_config.max_num_seqs - len(self.running)
        for request_id in list(self.waiting)[: max(room, 0)]:
            self.running[request_id] = self.waiting.pop(request_id)
        for request in list(self.running.values()):
            token, logprob = self._next_token(request)
            request.generated.append(token)
            request.logprobs.append({token: Logprob(logprob, 1)})
            reason = None
            max_tokens = request.params.max_tokens or self.vllm_config.max_model_len
            if token == EOS and not request.params.ignore_eos:
                reason = "stop"
            elif len(request.generated) >= max_tokens or (
                len(request.prompt) + len(request.generated) >= self.vllm_config.max_model_len
            ):
                reason = "length"
            if reason is not None:
                del self.running[request.internal_id]
            self._emit(request, reason)
        for logger in self.stat_loggers:
            logger.record(scheduler_stats=self.stats(), iteration_stats=None, engine_idx=0)

    def stats(self) -> SchedulerStats:
        blocks = sum(r.blocks for r in self.running.values())
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=min(blocks / self.vllm_config.num_blocks, 1.0),
        )

    def _next_token(self, request: _Request) -> tuple[int, float]:
        n = len(request.generated)
        if request.params.temperature == 0:
            if n >= len(TEXT):
                return (EOS, -0.1) if not request.params.ignore_eos else (ord(TEXT[n % len(TEXT)]), -0.1)
            return ord(TEXT[n]), -0.1
        assert request.rng is not None
        return ord(request.rng.choice("abcdefghij ")), -2.0

    def _emit(self, request: _Request, reason: str | None) -> None:
        kind = request.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and reason is None:
            return
        if kind == RequestOutputKind.DELTA:
            ids = request.generated[request.sent :]
            logprobs = request.logprobs[request.sent :]
        else:
            ids, logprobs = list(request.generated), list(request.logprobs)
        request.sent = len(request.generated)
        completion = CompletionOutput(
            index=0,
            text="",  # detokenize=False
            token_ids=ids,
            cumulative_logprob=sum(next(iter(p.values())).logprob for p in request.logprobs),
            logprobs=logprobs if request.params.logprobs is not None else None,
            finish_reason=reason,
        )
        output = RequestOutput(
            request.external_id, None, request.prompt, None, [completion], reason is not None, 0
        )
        request.queue.put(output)

    # the public API

    async def get_supported_tasks(self) -> tuple[str, ...]:
        self._run_output_handler()
        return self.vllm_config.supported_tasks

    def get_tokenizer(self) -> CharTokenizer:
        return self.tokenizer

    async def add_request(self, request_id: str, prompt: Any, params: SamplingParams) -> _Collector:
        if self.dead is not None:
            raise EngineDeadError()
        if not isinstance(params, SamplingParams):
            raise TypeError("params must be SamplingParams")
        if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
            raise TypeError(f"the fake takes a TokensPrompt, got {prompt!r}")
        ids = list(prompt["prompt_token_ids"])
        if len(ids) >= self.vllm_config.max_model_len:
            raise VLLMValidationError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {self.vllm_config.max_model_len}."
            )
        self._run_output_handler()
        self.params.append(params)
        self.prompts.append(prompt)
        queue = _Collector(params.output_kind)
        internal = f"{request_id}-{next(self._ids):08x}"
        rng = random.Random(params.seed) if params.temperature > 0 else None
        self.waiting[internal] = _Request(internal, request_id, ids, params, queue, rng=rng)
        return queue

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        queue: _Collector | None = None
        internal = None
        try:
            queue = await self.add_request(request_id, prompt, sampling_params)
            internal = next(r.internal_id for r in self.waiting.values() if r.queue is queue)
            finished = False
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            if internal is not None:
                await self.abort(internal, internal=True)
            raise
        except EngineDeadError:
            raise
        except VLLMClientError:
            raise
        except Exception as exc:
            if internal is not None:
                await self.abort(internal, internal=True)
            raise EngineGenerateError() from exc

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        ids = (request_id,) if isinstance(request_id, str) else list(request_id)
        self.abort_calls += 1
        for rid in ids:
            for table in (self.running, self.waiting):
                for key, request in list(table.items()):
                    if (key == rid) if internal else (request.external_id == rid):
                        del table[key]
                        self.aborted.append(request.external_id)
                        self._emit(request, "abort")

    def kill(self, error: Exception | None = None) -> None:
        """The engine core died: every request's queue gets EngineDeadError."""
        self.dead = error or EngineDeadError("EngineCore encountered an issue.")
        for table in (self.running, self.waiting):
            for request in table.values():
                request.queue.put(EngineDeadError("EngineCore encountered an issue."))
            table.clear()

    def shutdown(self, timeout: float | None = None) -> None:
        self.shut_down = True
        handler = self.output_handler
        if handler is not None and not handler.done():
            handler.get_loop().call_soon_threadsafe(handler.cancel)

    @property
    def live(self) -> int:
        return len(self.running) + len(self.waiting)


# --- the package ---

MODULES: dict[str, dict[str, Any]] = {
    "vllm": {
        "SamplingParams": SamplingParams,
        "TokensPrompt": TokensPrompt,
        "TextPrompt": TextPrompt,
        "RequestOutput": RequestOutput,
        "CompletionOutput": CompletionOutput,
        "AsyncEngineArgs": AsyncEngineArgs,
        "__version__": "0.33.0+fake",
    },
    "vllm.engine": {},
    "vllm.engine.arg_utils": {"EngineArgs": EngineArgs, "AsyncEngineArgs": AsyncEngineArgs},
    "vllm.exceptions": {
        "VLLMError": VLLMError,
        "VLLMClientError": VLLMClientError,
        "VLLMValidationError": VLLMValidationError,
    },
    "vllm.sampling_params": {"SamplingParams": SamplingParams, "RequestOutputKind": RequestOutputKind},
    "vllm.inputs": {"TokensPrompt": TokensPrompt, "TextPrompt": TextPrompt},
    "vllm.outputs": {"RequestOutput": RequestOutput, "CompletionOutput": CompletionOutput},
    "vllm.logprobs": {"Logprob": Logprob},
    "vllm.usage": {},
    "vllm.usage.usage_lib": {"UsageContext": UsageContext},
    "vllm.v1": {},
    "vllm.v1.engine": {},
    "vllm.v1.engine.async_llm": {"AsyncLLM": AsyncLLM},
    "vllm.v1.engine.exceptions": {
        "EngineDeadError": EngineDeadError,
        "EngineGenerateError": EngineGenerateError,
    },
    "vllm.v1.metrics": {},
    "vllm.v1.metrics.loggers": {"StatLoggerBase": StatLoggerBase},
    "vllm.v1.metrics.stats": {"SchedulerStats": SchedulerStats},
}


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the fake package in sys.modules for one test (``find_spec('vllm')`` finds it), and
    leave ``VLLM_WORKER_MULTIPROC_METHOD`` as the test found it."""
    import sys

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    for name, attributes in MODULES.items():
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        for key, value in attributes.items():
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)
    ENGINES.clear()
