"""A generation model's series on ``/metrics``, under the names vLLM's Prometheus metrics use
(and Triton's vLLM backend), with Triton's ``model`` and ``version`` labels::

    vllm:time_to_first_token_seconds   histogram   request start to its first token
    vllm:inter_token_latency_seconds   histogram   between two tokens of a request
    vllm:time_per_output_token_seconds histogram   the same (the name Triton's vLLM backend uses)
    vllm:e2e_request_latency_seconds   histogram   request start to its end
    vllm:request_prompt_tokens         histogram   prompt tokens per request
    vllm:request_generation_tokens     histogram   generated tokens per request
    vllm:prompt_tokens_total           counter
    vllm:generation_tokens_total       counter     its rate is the output tokens/s
    vllm:request_success_total         counter     by finished_reason (stop, length, abort)
    vllm:num_requests_running          gauge       sequences in the engine's running batch
    vllm:num_requests_waiting          gauge       sequences waiting for a place in it
    vllm:kv_cache_usage_perc           gauge       KV-cache blocks in use, 0..1

They go out through the custom-metrics registry that python models' ``pb_utils`` metrics use,
and go away when the model unloads.
"""

from __future__ import annotations

from flowserve.nodes.backends.pb_utils import Metric, MetricFamily
from flowserve.nodes.llm.engine import EngineLoad

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
TOKEN_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]
REASONS = ("stop", "length", "abort")


def _family(name: str, doc: str, kind: int) -> MetricFamily:
    return MetricFamily(name, doc, kind)


class LlmMetrics:
    def __init__(self, model: str, version: int) -> None:
        labels = {"model": model, "version": str(version)}
        h, c, g = MetricFamily.HISTOGRAM, MetricFamily.COUNTER, MetricFamily.GAUGE

        def hist(name: str, doc: str, buckets: list[float]) -> Metric:
            return _family(name, doc, h).Metric(labels=labels, buckets=buckets)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist(
            "vllm:time_per_output_token_seconds", "Time per output token in seconds.", ITL_BUCKETS
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "End to end request latency in seconds.", E2E_BUCKETS
        )
        self.prompt_hist = hist("vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.generation_hist = hist(
            "vllm:request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS
        )
        self.prompt_tokens = _family("vllm:prompt_tokens_total", "Prefill tokens processed.", c).Metric(
            labels=labels
        )
        self.generation_tokens = _family(
            "vllm:generation_tokens_total", "Generation tokens processed.", c
        ).Metric(labels=labels)
        success = _family("vllm:request_success_total", "Requests finished, by reason.", c)
        self.success = {r: success.Metric(labels={**labels, "finished_reason": r}) for r in REASONS}
        running = _family("vllm:num_requests_running", "Requests in the engine's running batch.", g)
        self.running = running.Metric(labels=labels)
        waiting = _family("vllm:num_requests_waiting", "Requests waiting to join the running batch.", g)
        self.waiting = waiting.Metric(labels=labels)
        kv_usage = _family("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", g)
        self.kv_usage = kv_usage.Metric(labels=labels)

    def set_load(self, load: EngineLoad) -> None:
        self.running.set(load.running)
        self.waiting.set(load.waiting)
        self.kv_usage.set(load.kv_cache_usage)

    def token(self, since_s: float, first: bool) -> None:
        if first:
            self.ttft.observe(since_s)
        else:
            self.itl.observe(since_s)
            self.tpot.observe(since_s)

    def finished(self, reason: str, prompt_tokens: int, generated: int, e2e_s: float) -> None:
        self.success[reason if reason in self.success else "abort"].increment(1)
        self.prompt_tokens.increment(prompt_tokens)
        self.generation_tokens.increment(generated)
        self.prompt_hist.observe(prompt_tokens)
        self.generation_hist.observe(generated)
        self.e2e.observe(e2e_s)
