"""The vLLM engine (GPU machines): vLLM's ``AsyncLLM`` (the V1 engine; ``AsyncLLMEngine`` in
older releases is the same class), built from model.json as Triton's vLLM backend does
(every key but flowserve's own is an ``AsyncEngineArgs`` field).

Prompts go in as token ids (``TokensPrompt``), outputs come back as deltas
(``RequestOutputKind.DELTA``) without vLLM's detokenizer (the node decodes, as for every
engine). Closing a request's stream aborts it in vLLM, which frees its KV blocks. The running
and waiting sequences and the KV-cache use come from a stat logger that vLLM calls once per
engine step. Imported only when a model selects this engine and vLLM is installed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from flowserve.core.errors import InvalidArgument, Unavailable, Unsupported
from flowserve.nodes.backends._support import require
from flowserve.nodes.llm.engine import EngineLoad, Sampling, Tokenizer, Tokens
from flowserve.nodes.llm.params import OWN_KEYS, EngineConfig


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


class VllmEngine:
    name = "vllm"

    def __init__(self, model: str, config: EngineConfig) -> None:
        self.model_name = model
        self.config = config
        self.tokenizer: Tokenizer
        self._engine: Any = None
        self._load = EngineLoad()

    async def start(self) -> None:
        if not vllm_installed():
            raise Unsupported(
                f"model '{self.model_name}': model.json selects the vLLM engine, but vLLM is not installed "
                "here (pip install vllm, on a GPU machine); 'engine': 'transformers' runs anywhere, "
                "'auto' picks vLLM only where it is installed and a GPU is present"
            )
        vllm = require("vllm", self.model_name, "vllm", "llm")
        engine_args_class = importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs
        try:
            engine_class = importlib.import_module("vllm.v1.engine.async_llm").AsyncLLM
        except ImportError:  # an older release: the same interface under its old name
            engine_class = vllm.AsyncLLMEngine
        fields = {k: v for k, v in self.config.args.items() if k not in OWN_KEYS}
        try:
            engine_args = engine_args_class(**fields)
        except TypeError as exc:
            raise InvalidArgument(f"model '{self.model_name}': model.json: {exc}") from None
        self._engine = engine_class.from_engine_args(engine_args, stat_loggers=[self._stat_logger()])
        self.tokenizer = await self._engine.get_tokenizer()

    def _stat_logger(self) -> Any:
        base: Any = importlib.import_module("vllm.v1.metrics.loggers").StatLoggerBase
        engine = self

        class _Load(base):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, *args: Any, **kwargs: Any) -> None:
                if scheduler_stats is not None:
                    engine._load = EngineLoad(
                        int(scheduler_stats.num_running_reqs),
                        int(scheduler_stats.num_waiting_reqs),
                        float(getattr(scheduler_stats, "kv_cache_usage", 0.0)),
                    )

            def log_engine_initialized(self) -> None:
                pass

        return _Load

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.shutdown()

    def load(self) -> EngineLoad:
        return self._load

    async def generate(
        self, request_id: str, prompt: Sequence[int], sampling: Sampling
    ) -> AsyncGenerator[Tokens, None]:
        engine = self._engine
        if engine is None:
            raise Unavailable(f"model '{self.model_name}': the engine is not running")
        vllm = importlib.import_module("vllm")
        delta = importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA
        params = vllm.SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            seed=sampling.seed,
            ignore_eos=sampling.ignore_eos,
            logprobs=0 if sampling.logprobs else None,  # 0: the sampled token's only
            detokenize=False,
            output_kind=delta,
        )
        prompt_ids = importlib.import_module("vllm.inputs").TokensPrompt(prompt_token_ids=list(prompt))
        stream = engine.generate(prompt_ids, params, request_id)
        finished = False
        try:
            async for out in stream:
                completion = out.outputs[0]
                finished = bool(out.finished)
                reason = completion.finish_reason if finished else None
                ids = list(completion.token_ids)
                probs = None
                if sampling.logprobs and completion.logprobs is not None:
                    probs = [float(lp[t].logprob) for t, lp in zip(ids, completion.logprobs, strict=False)]
                yield Tokens(ids, finished, "length" if reason == "length" else reason, probs)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
            if not finished:
                with contextlib.suppress(Exception):
                    await engine.abort(request_id)
