"""The vLLM engine (GPU machines): vLLM's V1 ``AsyncLLM``, built from model.json as Triton's vLLM
backend builds it (every key but flowserve's own is an ``AsyncEngineArgs`` field, with
``UsageContext.OPENAI_API_SERVER``: the batch defaults of ``vllm serve``).

model.json as Triton's vLLM backend users write it also works: string values (``"enforce_eager":
"true"``, ``"gpu_memory_utilization": "0.5"``) are converted to the field's type (a string
``"false"`` would otherwise be true), and keys that older vLLM releases or Triton's backend took
but the installed ``AsyncEngineArgs`` refuses are translated (``disable_log_requests``) or dropped
with a warning where they no longer do anything (:data:`OBSOLETE_KEYS`), as are the transformers
engine's own keys (a model.json written for ``"engine": "auto"``). Any other unknown key fails the
load, naming the model and the key.

The engine is built in a worker thread (loading the model takes minutes and must not stall the
event loop); vLLM then starts its output handler lazily on flowserve's event loop, at the first
call that needs it (``get_supported_tasks`` right after the build). vLLM's engine core runs in a
child process, spawned rather than forked unless ``VLLM_WORKER_MULTIPROC_METHOD`` says otherwise:
this process may have initialised CUDA (the ``auto`` engine's GPU probe) and runs threads.

Prompts go in as token ids (``TokensPrompt``); outputs come back as deltas
(``RequestOutputKind.DELTA``: each ``CompletionOutput.token_ids`` holds only the new tokens) without
vLLM's detokenizer (the node decodes and applies stop strings, as for every engine). One request
is one sequence (``n`` = 1). Closing a request's stream aborts it in vLLM, which frees its KV
blocks. The running and waiting sequences and the KV-cache use come from a stat logger that vLLM
calls once per engine step. Imported only when a model selects this engine and vLLM is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import logging
import os
import types
import typing
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import Any

from flowserve.core.errors import (
    FlowserveError,
    InternalError,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    Unsupported,
)
from flowserve.nodes.llm.engine import EngineLoad, Ranked, Sampling, Tokenizer, Tokens
from flowserve.nodes.llm.params import OWN_KEYS, TRANSFORMERS_KEYS, EngineConfig

log = logging.getLogger("flowserve.llm")

# model.json keys that Triton's vLLM backend or older vLLM releases took and that do nothing now:
# dropped with a warning when the installed AsyncEngineArgs does not know them
OBSOLETE_KEYS = {
    # Triton's vLLM backend (2024): resolve 'model' against model.json's folder; flowserve always
    # resolves 'model' and 'tokenizer' against the version folder when the path exists there
    "resolve_model_relative_to_config_file": "flowserve resolves 'model' against the version folder",
    "use_v2_block_manager": "the only block manager since vLLM 0.6",
    "lora_extra_vocab_size": "removed from vLLM (LoRA adapters no longer add vocabulary)",
    "swap_space": "vLLM's V1 engine recomputes preempted sequences instead of swapping them",
    "engine_use_ray": "removed from vLLM",
    "max_log_len": "request logging only",
}
# renamed keys: old name -> (new name, value converter)
RENAMED_KEYS: dict[str, tuple[str, Any]] = {
    "disable_log_requests": ("enable_log_requests", lambda v: not v),
    "worker_use_ray": ("distributed_executor_backend", lambda v: "ray" if v else None),
}
# what a generation request needs of the model (AsyncLLM.get_supported_tasks)
GENERATE_TASK = "generate"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


@dataclasses.dataclass(frozen=True)
class _Api:
    """The parts of vLLM the engine uses, imported once."""

    engine_args: Any  # vllm.engine.arg_utils.AsyncEngineArgs
    async_llm: Any  # vllm.v1.engine.async_llm.AsyncLLM
    sampling_params: Any  # vllm.SamplingParams
    delta: Any  # vllm.sampling_params.RequestOutputKind.DELTA
    tokens_prompt: Any  # vllm.inputs.TokensPrompt
    usage_context: Any  # vllm.usage.usage_lib.UsageContext.OPENAI_API_SERVER
    stat_logger_base: Any  # vllm.v1.metrics.loggers.StatLoggerBase


def _import_api(model: str) -> _Api:
    try:
        return _Api(
            engine_args=importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs,
            async_llm=importlib.import_module("vllm.v1.engine.async_llm").AsyncLLM,
            sampling_params=importlib.import_module("vllm.sampling_params").SamplingParams,
            delta=importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA,
            tokens_prompt=importlib.import_module("vllm.inputs").TokensPrompt,
            usage_context=importlib.import_module("vllm.usage.usage_lib").UsageContext.OPENAI_API_SERVER,
            stat_logger_base=importlib.import_module("vllm.v1.metrics.loggers").StatLoggerBase,
        )
    except Exception as exc:  # ImportError, AttributeError (a release without V1), or CUDA errors
        version = _vllm_version()
        raise Unsupported(
            f"model '{model}': vLLM {version} is installed but its V1 engine cannot be imported "
            f"({type(exc).__name__}: {exc}); flowserve's vLLM engine needs vLLM's AsyncLLM "
            "(vllm.v1.engine.async_llm); 'engine': 'transformers' runs anywhere"
        ) from None


def _vllm_version() -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("vllm")
    return "(unknown version)"


class VllmEngine:
    name = "vllm"

    def __init__(self, model: str, config: EngineConfig) -> None:
        self.model_name = model
        self.config = config
        self.tokenizer: Tokenizer
        self._engine: Any = None
        self._api: _Api | None = None
        self._loads: dict[int, EngineLoad] = {}  # the last stats of each engine core (data parallel)
        self._live: set[str] = set()  # requests in vLLM (started, not finished)

    # --- start and stop ---

    async def start(self) -> None:
        if not vllm_installed():
            raise Unsupported(
                f"model '{self.model_name}': model.json selects the vLLM engine, but vLLM is not installed "
                "here (pip install vllm, on a GPU machine); 'engine': 'transformers' runs anywhere, "
                "'auto' picks vLLM only where it is installed and a GPU is present"
            )
        # before vLLM reads it: a forked engine core cannot use CUDA once this process has
        # initialised it, and forking a process that runs threads (gRPC, loaders) is unsafe
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        api = await asyncio.to_thread(_import_api, self.model_name)  # imports torch: seconds
        arguments = engine_arguments(self.model_name, self.config.args, api.engine_args)
        try:
            engine_args = api.engine_args(**arguments)
        except Exception as exc:  # TypeError, or a value vLLM's __post_init__ refuses
            raise InvalidArgument(
                f"model '{self.model_name}': model.json: vLLM's AsyncEngineArgs refuses it "
                f"({type(exc).__name__}: {exc})"
            ) from None
        stat_logger = self._stat_logger(api.stat_logger_base)
        build = asyncio.ensure_future(
            asyncio.to_thread(
                api.async_llm.from_engine_args,
                engine_args,
                usage_context=api.usage_context,
                stat_loggers=[stat_logger],
            )
        )
        try:
            engine = await asyncio.shield(build)
        except asyncio.CancelledError:  # the load was cancelled: the thread goes on, its engine stops
            build.add_done_callback(_shut_down_when_built)
            raise
        except Exception as exc:
            raise Unavailable(
                f"model '{self.model_name}': the vLLM engine failed to start ({type(exc).__name__}: {exc})"
            ) from exc
        self._api = api
        self._engine = engine
        try:
            # on the event loop: starts vLLM's output handler here, and checks the engine answers
            tasks = await engine.get_supported_tasks()
            if GENERATE_TASK not in tasks:
                raise InvalidArgument(
                    f"model '{self.model_name}': vLLM loads '{self.config.args.get('model')}' for "
                    f"{', '.join(map(str, tasks)) or 'no task'}, not text generation"
                )
            tokenizer = engine.get_tokenizer()  # sync now; a coroutine in older releases
            if inspect.isawaitable(tokenizer):
                tokenizer = await tokenizer
            self.tokenizer = tokenizer
        except BaseException as exc:
            await self.stop()
            if isinstance(exc, FlowserveError) or not isinstance(exc, Exception):
                raise
            raise Unavailable(
                f"model '{self.model_name}': the vLLM engine started but does not answer "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def _stat_logger(self, base: Any) -> Any:
        """A per-engine stat logger class (vLLM's ``StatLoggerFactory``: called with the config
        and the engine index) that keeps the last scheduler stats of each engine core."""
        loads = self._loads

        class _Load(base):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                self.engine_index = engine_index

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any = None,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if scheduler_stats is not None:
                    loads[self.engine_index] = _load_of(scheduler_stats)

            def log_engine_initialized(self) -> None:
                pass

        return _Load

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        live, self._live = list(self._live), set()
        if live:  # their streams end now, with reason "abort", rather than wait forever
            with contextlib.suppress(Exception):
                await _maybe_await(engine.abort(live))
        with contextlib.suppress(Exception):
            engine.shutdown()
        self._loads.clear()

    def load(self) -> EngineLoad:
        if not self._live or not self._loads:
            # vLLM reports stats only on engine steps: after the last request finished or was
            # aborted none may come, and vLLM counts free and cached-but-free blocks alike
            return EngineLoad()
        loads = list(self._loads.values())
        return EngineLoad(
            sum(x.running for x in loads),
            sum(x.waiting for x in loads),
            sum(x.kv_cache_usage for x in loads) / len(loads),
        )

    # --- requests ---

    def sampling_params(self, sampling: Sampling) -> Any:
        """vLLM's ``SamplingParams`` for a request: deltas of token ids, no detokenizing, one
        sequence. Stop strings stay with the node (they need text)."""
        api = self._api
        if api is None:
            raise Unavailable(f"model '{self.model_name}': the engine is not running")
        try:
            return api.sampling_params(
                n=1,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=max(sampling.top_k, 0),  # 0: off (vLLM still takes -1, but prefers 0)
                seed=sampling.seed,
                ignore_eos=sampling.ignore_eos,
                logprobs=sampling.logprobs,  # 0: the sampled token's only; N: and the N likeliest
                stop_token_ids=list(sampling.stop_token_ids),
                detokenize=False,
                output_kind=api.delta,
            )
        except Exception as exc:  # VLLMValidationError (ValueError in older releases)
            raise InvalidArgument(
                f"model '{self.model_name}': vLLM refuses the sampling parameters: {exc}"
            ) from None

    async def generate(
        self, request_id: str, prompt: Sequence[int], sampling: Sampling
    ) -> AsyncGenerator[Tokens, None]:
        engine, api = self._engine, self._api
        if engine is None or api is None:
            raise Unavailable(f"model '{self.model_name}': the engine is not running")
        params = self.sampling_params(sampling)
        wants_logprobs = sampling.logprobs is not None
        stream = engine.generate(
            prompt=api.tokens_prompt(prompt_token_ids=list(prompt)),
            sampling_params=params,
            request_id=request_id,
        )
        self._live.add(request_id)
        finished = False
        try:
            last: Tokens | None = None
            async for out in stream:
                finished = bool(out.finished)
                completion = next((c for c in out.outputs if c.index == 0), None)
                ids = list(completion.token_ids) if completion is not None else []  # DELTA: new only
                if not ids and not finished:
                    continue
                probs = ranked = None
                if completion is not None and completion.logprobs is not None and wants_logprobs:
                    probs, ranked = _token_logprobs(ids, completion.logprobs, sampling.logprobs or 0)
                reason = None
                if finished:
                    reason = (completion.finish_reason if completion is not None else None) or "abort"
                tokens = Tokens(ids, finished, reason, probs, ranked)
                if finished:  # yielded once vLLM's generator has ended: closing it then aborts nothing
                    last = tokens
                    continue
                yield tokens
            if last is None:  # vLLM's stream ended without a last output
                finished = True
                last = Tokens((), True, "abort")
            yield last
        except Exception as exc:
            raise self._error(exc) from exc
        finally:
            self._live.discard(request_id)
            # closing vLLM's generator aborts the request there (it frees the KV blocks); the
            # explicit abort covers a stream closed before vLLM's generator ran
            with contextlib.suppress(Exception):
                await stream.aclose()
            if not finished and self._engine is engine:
                with contextlib.suppress(Exception):
                    await _maybe_await(engine.abort(request_id))

    def _error(self, exc: BaseException) -> FlowserveError:
        """A vLLM error as flowserve's, naming the model: a request vLLM refuses (a prompt longer
        than max_model_len) is the client's, a full queue is retryable, a dead engine unavailable."""
        if isinstance(exc, FlowserveError):
            return exc
        names = {cls.__name__ for cls in type(exc).__mro__}
        cause = exc.__cause__ if "EngineGenerateError" in names and exc.__cause__ else exc
        text = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        where = f"model '{self.model_name}'"
        if "EngineDeadError" in names:
            return Unavailable(f"{where}: the vLLM engine died ({text}); reload the model")
        if names & {"QueueOverflowError", "MaxQueuedTokensError"}:
            return ResourceExhausted(f"{where}: vLLM's request queue is full ({text}); try again later")
        if names & {"VLLMClientError", "VLLMValidationError", "ValueError"}:
            return InvalidArgument(f"{where}: vLLM refuses the request: {text}")
        return InternalError(f"{where}: vLLM failed the request: {text}")


def _load_of(stats: Any) -> EngineLoad:
    """An engine core's :class:`EngineLoad` from vLLM's ``SchedulerStats`` (waiting: those that
    wait for room and those deferred, as vLLM's own gauge counts them)."""
    usage: Any = getattr(stats, "kv_cache_usage", None)
    if usage is None:  # its name in older releases
        usage = getattr(stats, "gpu_cache_usage", 0.0)
    return EngineLoad(
        int(stats.num_running_reqs),
        int(stats.num_waiting_reqs) + int(getattr(stats, "num_skipped_waiting_reqs", 0) or 0),
        float(usage),
    )


def _token_logprobs(
    ids: Sequence[int], logprobs: Iterable[Any], most: int
) -> tuple[list[float], list[Ranked]]:
    """Each new token's log-probability and :class:`Ranked` from vLLM's per-position
    ``{token id: Logprob(logprob, rank, decoded_token)}``: the ``most`` likely tokens (the
    request's ``SamplingParams.logprobs``) and the sampled token, when it is not one of them."""
    values: list[float] = []
    ranked: list[Ranked] = []
    for token, position in zip(ids, logprobs, strict=False):
        entries = dict(position) if position is not None else {}
        entry = entries.get(token)
        values.append(float(entry.logprob) if entry is not None else 0.0)
        rank = getattr(entry, "rank", None) if entry is not None else None
        best = sorted(((int(t), float(e.logprob)) for t, e in entries.items()), key=lambda pair: -pair[1])
        ranked.append(Ranked(int(rank) if rank else 1, tuple(best[:most])))
    return values, ranked


def _shut_down_when_built(build: asyncio.Future[Any]) -> None:
    if not build.cancelled() and build.exception() is None:
        with contextlib.suppress(Exception):
            build.result().shutdown()


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# --- model.json -> AsyncEngineArgs ---


def engine_arguments(model: str, args: Mapping[str, Any], engine_args_class: Any) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` keyword arguments for a model.json (its keys but flowserve's own):
    strings converted to the field's type, old names translated, obsolete keys and the
    transformers engine's dropped with a warning; an unknown key is an error naming the model."""
    fields = {f.name: f.type for f in dataclasses.fields(engine_args_class)}
    with contextlib.suppress(Exception):  # string annotations, where they resolve
        hints = typing.get_type_hints(engine_args_class)
        fields = {name: hints.get(name, kind) for name, kind in fields.items()}
    out: dict[str, Any] = {}
    dropped: list[str] = []
    for key, raw in args.items():
        if key in OWN_KEYS:
            continue
        value = raw
        if key not in fields and key in RENAMED_KEYS and RENAMED_KEYS[key][0] in fields:
            new, convert = RENAMED_KEYS[key]
            value = convert(_as_bool(model, key, raw))
            log.warning(
                "model '%s': model.json '%s' is '%s' in this vLLM; using '%s': %r",
                model, key, new, new, value,
            )  # fmt: skip
            if new in args or value is None:
                continue
            key = new
        elif key not in fields:
            if key in OBSOLETE_KEYS or key in TRANSFORMERS_KEYS:
                dropped.append(key)
                continue
            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise InvalidArgument(
                f"model '{model}': model.json '{key}' is not an engine argument of vLLM "
                f"{_vllm_version()} (AsyncEngineArgs){hint}"
            )
        out[key] = _convert(model, key, value, fields[key])
    if dropped:
        log.warning(
            "model '%s': the vLLM engine ignores model.json %s (%s)",
            model,
            ", ".join(repr(k) for k in dropped),
            "; ".join(f"{k}: {OBSOLETE_KEYS.get(k, 'a transformers engine setting')}" for k in dropped),
        )
    return out


def _as_bool(model: str, key: str, value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise InvalidArgument(f"model '{model}': model.json '{key}' must be true or false, got {value!r}")
    return bool(value)


def _convert(model: str, key: str, value: Any, annotation: Any) -> Any:
    """A model.json string as the field's type when the field takes no strings (Triton's vLLM
    backend samples write ``"enforce_eager": "true"``): bool, int or float."""
    if not isinstance(value, str):
        return value
    kinds = _kinds(annotation)
    if str in kinds or not kinds & {bool, int, float}:
        return value  # a string field, or one vLLM converts itself (a config given as a dict)
    text = value.strip()
    if bool in kinds and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if int in kinds:
        with contextlib.suppress(ValueError):
            return int(text)
    if float in kinds:
        with contextlib.suppress(ValueError):
            return float(text)
    if text.lower() in ("none", "null") and type(None) in kinds:
        return None
    names = ", ".join(sorted(k.__name__ for k in kinds))
    raise InvalidArgument(f"model '{model}': model.json '{key}' must be {names}, got {value!r}")


def _kinds(annotation: Any) -> set[type]:
    """The plain types an annotation admits (unions and Literals unfolded; strings for any
    annotation not understood, so its value passes unchanged)."""
    if isinstance(annotation, str):
        return {str}
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        kinds: set[type] = set()
        for arg in typing.get_args(annotation):
            kinds |= _kinds(arg)
        return kinds
    if origin is typing.Literal:
        return {type(v) for v in typing.get_args(annotation)}
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if annotation is type(None):
        return {type(None)}
    if annotation in (bool, int, float, str):
        return {annotation}
    if isinstance(annotation, type):
        return {annotation}
    return {str}
