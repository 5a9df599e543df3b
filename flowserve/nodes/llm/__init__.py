"""Generation (LLM) nodes: a decoupled node whose engine batches per iteration.

Sequences join and leave the engine's running batch at every decoding step (continuous
batching); each piece of text the engine yields is one response of the node, and travels on
through the graph like any other. The engine (transformers' continuous batching, vLLM) owns the
running batch and the KV cache; this package owns admission, cancellation, stop strings,
streaming, metrics and the wiring into graphs.

- :mod:`.engine`: the engine interface (submit token ids with sampling parameters, stream tokens,
  cancel by closing the stream, report the running batch and KV-cache use).
- :mod:`.transformers_engine` and :mod:`.vllm_engine`: the two engines (imported lazily).
- :mod:`.params`: ``model.json`` and sampling parameters, parsed and checked (pure).
- :mod:`.textstream`: incremental detokenization and stop strings (pure).
- :mod:`.backend`: the node, as a model backend (config.pbtxt ``backend: "vllm"`` or ``"llm"``).
"""
