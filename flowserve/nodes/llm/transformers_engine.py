"""The transformers engine: continuous batching with paged attention (transformers 5.x
``ContinuousBatchingManager``), on the CPU or a GPU.

The manager runs its own generation thread; requests join and leave its running batch at
every step. Each request's outputs come back through a result handler that the manager calls on
the event loop (``call_soon_threadsafe``), so nothing here blocks the loop or polls. Sampling
is per request and flowserve's own (:mod:`flowserve.nodes.llm.sampler`, in place of the
model runner's sampling step): temperature, top-p and top-k, a temperature of 0 (or top-k 1) is
greedy and costs an argmax, and a request's ``seed`` gives it its own random generator;
unseeded requests share the engine's (seeded by ``seed`` in model.json). Token
log-probabilities are those of the distribution the token was drawn from (after the request's
temperature, top-k and top-p: 0 for a greedy token).

KV-cache use is reported as vLLM reports it: blocks held by sequences in the engine. A finished or
cancelled sequence's complete blocks stay in transformers' prefix cache, evictable (handed out
again as soon as a sequence needs them, or shared by a later prompt with the same prefix): they
count as free, as vLLM's evictable cached blocks do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from flowserve.core.errors import InternalError, InvalidArgument, Unavailable
from flowserve.nodes.backends._support import require
from flowserve.nodes.llm.engine import EngineLoad, Ranked, Sampling, Tokenizer, Tokens
from flowserve.nodes.llm.params import EngineConfig
from flowserve.nodes.llm.sampler import RowSampler, row_for

log = logging.getLogger("flowserve.llm")

# CPU defaults (a GPU's are inferred by transformers from its free memory): tokens the KV cache
# holds across all sequences, its page size, tokens per forward pass, and sequences per step.
# The last matters most: transformers sizes its static batch tensors by it (1024 when unset) and
# computes the logits of every row at every step, so on the CPU an unset value makes each step
# of SmolLM2-135M about 4 s instead of about 60 ms (benchmarks/llm.py).
CPU_CACHE_TOKENS = 8192
CPU_PAGE_SIZE = 32
CPU_MAX_BATCH_TOKENS = 512
CPU_MAX_REQUESTS = 32


class TransformersEngine:
    name = "transformers"

    def __init__(self, model: str, config: EngineConfig) -> None:
        self.model_name = model
        self.config = config
        self.tokenizer: Tokenizer = _NoTokenizer()
        self._manager: Any = None
        self._model: Any = None
        self._sampler: RowSampler | None = None
        self._torch: Any = None
        self.device = "cpu"
        self.eos: list[int] = []

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        args = self.config.args
        torch = require("torch", self.model_name, "llm (transformers engine)", "llm")
        transformers = require("transformers", self.model_name, "llm (transformers engine)", "llm")
        cb_config_class = transformers.generation.configuration_utils.ContinuousBatchingConfig
        source = args["model"]
        device = str(args.get("device", "auto"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        common: dict[str, Any] = {"local_files_only": True}
        if args.get("gguf_file"):
            common["gguf_file"] = args["gguf_file"]
        if args.get("trust_remote_code"):
            common["trust_remote_code"] = True
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(args.get("tokenizer", source), **common)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                source, dtype=_dtype(torch, args.get("dtype", "auto"), device), **common
            )
        except OSError as exc:  # not a local path, not in the local cache: never downloaded here
            raise Unavailable(
                f"model '{self.model_name}': cannot load '{source}' from local files ({exc}); flowserve "
                "never downloads a model at run time: give a local path in model.json 'model'"
            ) from None
        model = model.to(device)
        self.tokenizer = tokenizer
        self.eos = _eos_ids(model, tokenizer)
        # no logits processors: flowserve's sampler replaces the runner's sampling step, which
        # runs in Python at every step (hence no CUDA graphs, and one batch in flight at a time)
        cb_args: dict[str, Any] = {
            "seed": args.get("seed"),
            "return_logprobs": True,
            "use_cuda_graph": False,
            "use_async_batching": False,
        }
        if device == "cpu":
            page = int(args.get("page_size", CPU_PAGE_SIZE))
            cb_args.update(
                page_size=page,
                num_blocks=int(args.get("num_blocks", max(CPU_CACHE_TOKENS // page, 4))),
                max_batch_tokens=int(args.get("max_batch_tokens", CPU_MAX_BATCH_TOKENS)),
                max_requests_per_batch=int(args.get("max_requests_per_batch", CPU_MAX_REQUESTS)),
            )
        for key in ("page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch"):
            if key in args:
                cb_args[key] = int(args[key])
        generation = transformers.GenerationConfig(
            do_sample=False, temperature=None, top_p=None, top_k=None, eos_token_id=self.eos or None
        )
        manager = model.init_continuous_batching(
            generation_config=generation,
            continuous_batching_config=cb_config_class(**cb_args),
        )
        if manager.logit_processor.do_processing:
            raise InternalError(
                f"model '{self.model_name}': transformers added logits processors "
                f"({manager.logit_processor.logits_processor}); flowserve's sampler expects none"
            )
        # the batch processor the generation thread will use (created here, as warmup() does),
        # with flowserve's sampler in place of the model runner's sampling step
        processor = manager._create_batch_processor()
        if processor.use_async_batching:  # two batches in flight: the sampler could not tell its rows
            raise InternalError(f"model '{self.model_name}': transformers chose asynchronous batching")
        manager.batch_processor = processor
        sampler = RowSampler(torch, processor.inputs_and_outputs)
        processor.model_runner._sample = sampler
        manager.start()
        self._torch = torch
        self.device = device
        self._sampler = sampler
        self._model = model
        self._manager = manager

    async def stop(self) -> None:
        manager, self._manager = self._manager, None
        if manager is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.to_thread(manager.stop, True, 5.0)

    def load(self) -> EngineLoad:
        manager = self._manager
        processor = getattr(manager, "batch_processor", None)
        if processor is None:
            return EngineLoad()
        try:
            scheduler = processor.scheduler
            used = 1.0 - kv_free_fraction(processor.cache)
            return EngineLoad(len(scheduler.active_requests), len(scheduler.waiting_requests), used)
        except Exception:  # read from another thread while it changes: skip this reading
            return EngineLoad()

    async def generate(
        self, request_id: str, prompt: Sequence[int], sampling: Sampling
    ) -> AsyncGenerator[Tokens, None]:
        manager = self._manager
        if manager is None:
            raise Unavailable(f"model '{self.model_name}': the engine is not running")
        fatal = manager.background_thread_status.fatal_error
        if fatal is not None:
            raise Unavailable(f"model '{self.model_name}': the engine failed: {fatal}")
        if not prompt:
            raise InvalidArgument(f"model '{self.model_name}': the prompt is empty (no tokens)")
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        manager.register_result_handler(request_id, outputs.put_nowait)
        rows = self._sampler.rows if self._sampler is not None else {}
        rows[request_id] = row_for(self._torch, sampling, self.device)
        ranked_by_request = self._sampler.ranked if self._sampler is not None else {}
        ranked: deque[Ranked] | None = None
        logprobs = sampling.logprobs is not None
        if logprobs:
            ranked = ranked_by_request[request_id] = deque()
        finished = False
        try:
            added = manager.add_request(
                list(prompt),
                request_id=request_id,
                max_new_tokens=sampling.max_tokens,
                streaming=True,
                eos_token_id=-1 if sampling.ignore_eos else None,
            )
            if added is None:
                raise Unavailable(f"model '{self.model_name}': the engine is not accepting requests")
            sent = 0
            while not finished:
                out = await outputs.get()
                if out.error is not None:
                    finished = True
                    raise InternalError(f"model '{self.model_name}': generation failed: {out.error}")
                ids = out.generated_tokens
                new, first, sent = ids[sent:], sent, len(ids)
                # the sampler queued one Ranked per token, before the token reached this output
                ranks = None
                if ranked is not None:
                    ranks = [ranked.popleft() for _ in range(min(len(new), len(ranked)))]
                finished = out.is_finished()
                reason = None
                if finished:
                    reason = "length" if len(ids) >= sampling.max_tokens else "stop"
                    if reason == "stop" and ids and ids[-1] in self.eos:
                        new = new[:-1]  # the end-of-sequence token is no output
                probs = out.logprobs[first : first + len(new)] if logprobs else None
                yield Tokens(new, finished, reason, probs, ranks[: len(new)] if ranks is not None else None)
        finally:
            rows.pop(request_id, None)
            ranked_by_request.pop(request_id, None)
            if not finished:  # cancelled: its sequence and KV blocks go at the next step
                manager.cancel_request(request_id)
                router = manager.output_router
                with router._lock:
                    router.result_handlers.pop(request_id, None)


def kv_free_fraction(cache: Any) -> float:
    """The share of the paged cache that a new sequence can have: free blocks and sectors, and the
    evictable cached blocks (complete blocks of ended sequences that no sequence holds; the
    scheduler evicts them when it needs room), as vLLM counts its free block queue."""
    free = float(cache.compute_free_capacity(relative=False))
    for allocator in cache.cache_allocators.values():
        free += len(allocator.ledger.cached_blocks) * allocator.bytes_per_block
    total = cache.num_sectors * cache.bytes_per_sector
    return min(free / total, 1.0) if total else 1.0


def _dtype(torch: Any, name: Any, device: str) -> Any:
    if name in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise InvalidArgument(f"model.json 'dtype' '{name}' is not a torch dtype")
    return value


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    found: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in found:
                found.append(v)
    return found


class _NoTokenizer:
    """Before the engine loaded."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise Unavailable("the engine is not loaded")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise Unavailable("the engine is not loaded")

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        raise Unavailable("the engine is not loaded")
