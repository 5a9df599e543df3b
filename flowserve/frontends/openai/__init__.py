"""OpenAI-compatible front end: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``
(with server-sent events when ``stream`` is true) and ``/v1/embeddings``, on a port of its own
(``--openai-port``), over any model or graph of the data plane.

A completion runs a model or graph whose inputs are those of a generation node (``text_input``;
``messages`` for chat, which the node turns into a prompt with the tokenizer's chat template),
so a graph that routes, guards or edits the token stream serves OpenAI clients as it is. An
embedding runs any model or graph with one text input and a numeric output (the vector). Errors
have OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from flowserve.frontends.openai.server import OpenAIListener, start_openai

__all__ = ["OpenAIListener", "start_openai"]
