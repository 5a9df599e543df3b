"""Per-request sampling for the transformers engine: greedy rows cost an argmax, sampled rows get
their own temperature, top-k and top-p, and a request with a seed draws from its own random
generator (the same prompt and seed give the same tokens whatever else is in the batch).

transformers' continuous batching applies per-request sampling as logits processors over the
whole batch (``per_request_processors``): every step then sorts the vocabulary of every row twice
(top-k and top-p), greedy rows included, and all rows draw from one random generator. Instead the
engine starts without processors and :class:`RowSampler` replaces the model runner's sampling
step (``ModelRunner._sample``, called once per forward pass in the engine's thread with the
logits of the rows that get a new token, in the order of the batch's requests). Each row's
parameters are looked up by request id in a table the event loop fills when a request is added
and empties when it ends. Log-probabilities, computed only for the rows of requests that ask
for them, are the model's own (the log-softmax of the logits, before temperature, top-k and
top-p), as vLLM reports them by default; with them a token's rank among them and, when asked, the
most likely tokens at its position (:class:`Ranked`), queued per request for the engine's reader.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowserve.nodes.llm.engine import Ranked, Sampling


@dataclass(frozen=True, slots=True)
class Row:
    """One request's sampling, as the engine thread reads it; ``generator``: a seeded
    ``torch.Generator`` when the request has a seed, else None (the engine's shared one);
    ``logprobs``: -1 none, else each token's log-probability and rank and this many of the most
    likely tokens."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: Any = None
    logprobs: int = -1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


GREEDY = Row()


def row_for(torch: Any, sampling: Sampling, device: str) -> Row:
    """The :class:`Row` for a request's :class:`Sampling` (``top_k`` -1 is off, as 0)."""
    wanted = -1 if sampling.logprobs is None else sampling.logprobs
    row = Row(float(sampling.temperature), max(int(sampling.top_k), 0), float(sampling.top_p), None, wanted)
    if row.greedy:
        return GREEDY if wanted < 0 else Row(logprobs=wanted)
    if sampling.seed is None:
        return row
    generator = torch.Generator(device=device)
    generator.manual_seed(int(sampling.seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return dataclasses.replace(row, generator=generator)


def sample_rows(torch: Any, logits: Any, rows: Sequence[Row]) -> Any:
    """Next tokens for ``logits`` [N, V] (float32), row i sampled as ``rows[i]`` says (rows past
    the end of ``rows``: greedy): an [N] tensor."""
    tokens = torch.argmax(logits, dim=-1)
    picked = [i for i, row in enumerate(rows) if not row.greedy]
    if not picked:
        return tokens
    chosen = [rows[i] for i in picked]
    index = torch.tensor(picked, dtype=torch.long, device=logits.device)
    scores = logits.index_select(0, index)
    scores = scores / torch.tensor([r.temperature for r in chosen], device=logits.device).unsqueeze(-1)
    vocab = scores.size(-1)
    ks = [r.top_k if 0 < r.top_k < vocab else 0 for r in chosen]
    if any(ks):
        # the k-th largest of each row with a top-k (topk, not a sort of the vocabulary)
        largest = torch.topk(scores, max(ks), dim=-1).values
        at = torch.tensor([max(k, 1) - 1 for k in ks], dtype=torch.long, device=logits.device)
        threshold = largest.gather(1, at.unsqueeze(-1))
        off = torch.tensor([k == 0 for k in ks], device=logits.device).unsqueeze(-1)
        scores = scores.masked_fill((scores < threshold) & ~off, float("-inf"))
    ps = [r.top_p for r in chosen]
    if any(p < 1.0 for p in ps):
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the mass of the tokens ranked above each token
        top_p = torch.tensor(ps, device=logits.device).unsqueeze(-1)
        drop = before > top_p
        drop[:, 0] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = scores.softmax(dim=-1)
    drawn = torch.empty(len(chosen), dtype=torch.long, device=logits.device)
    shared = [j for j, r in enumerate(chosen) if r.generator is None]
    if shared:
        at_shared = torch.tensor(shared, dtype=torch.long, device=logits.device)
        drawn[at_shared] = torch.multinomial(probs.index_select(0, at_shared), 1).squeeze(-1)
    for j, r in enumerate(chosen):
        if r.generator is not None:
            drawn[j] = torch.multinomial(probs[j], 1, generator=r.generator)[0]
    tokens[index] = drawn
    return tokens


def score_rows(torch: Any, logits: Any, tokens: Any, rows: Sequence[Row]) -> dict[int, tuple[float, Ranked]]:
    """For the rows that ask for log-probabilities (``Row.logprobs`` >= 0): row index -> the
    chosen token's log-probability under the model (log-softmax of ``logits``) and its
    :class:`Ranked` (its rank, and the row's ``logprobs`` most likely tokens)."""
    wanted = [i for i, row in enumerate(rows) if row.logprobs >= 0]
    if not wanted:
        return {}
    index = torch.tensor(wanted, dtype=torch.long, device=logits.device)
    scores = logits.index_select(0, index).float().log_softmax(dim=-1)
    chosen = scores.gather(1, tokens.index_select(0, index).unsqueeze(-1))
    ranks = (scores > chosen).sum(dim=-1).add(1).tolist()
    values = chosen.squeeze(-1).tolist()
    most = max(rows[i].logprobs for i in wanted)
    top_ids: list[list[int]] = [[] for _ in wanted]
    top_values: list[list[float]] = [[] for _ in wanted]
    if most:
        best = torch.topk(scores, min(most, scores.size(-1)), dim=-1)
        top_ids, top_values = best.indices.tolist(), best.values.tolist()
    out = {}
    for j, i in enumerate(wanted):
        n = rows[i].logprobs
        top = tuple(zip(top_ids[j][:n], top_values[j][:n], strict=True))
        out[i] = (values[j], Ranked(int(ranks[j]), top))
    return out


class RowSampler:
    """The model runner's sampling step (see the module docstring). ``rows``: request id ->
    :class:`Row`, written by the event loop, read by the engine thread (a dict's get and set are
    atomic); ``batch``: the engine's inputs and outputs, whose ``requests_in_batch`` are the
    requests of the forward pass being sampled; ``ranked``: request id -> the queue of its
    tokens' :class:`Ranked`, for the requests that ask (the event loop adds and removes the
    queue; this thread appends, in the order of the request's tokens)."""

    def __init__(self, torch: Any, batch: Any) -> None:
        self.torch = torch
        self.batch = batch
        self.rows: dict[str, Row] = {}
        self.ranked: dict[str, deque[Ranked]] = {}

    def __call__(self, scores: Any, output_ids: Any) -> None:
        torch, rows = self.torch, self.rows
        requests = [f.state.request_id for f in self.batch.requests_in_batch if f.has_new_token]
        batch_rows = [rows.get(r, GREEDY) for r in requests]
        logits = scores[0]
        tokens = sample_rows(torch, logits, batch_rows)
        n = tokens.size(0)
        output_ids[0, :n].copy_(tokens)
        scored = score_rows(torch, logits, tokens, batch_rows)
        if not scored or output_ids.size(0) < 2:
            return
        values = [0.0] * n
        for i, (value, ranked) in scored.items():
            values[i] = value
            queue = self.ranked.get(requests[i])
            if queue is not None:
                queue.append(ranked)
        # the engine returns log-probabilities (their bits as int32)
        logprobs = torch.tensor(values, dtype=torch.float32, device=logits.device)
        output_ids[1, :n].copy_(logprobs.view(dtype=torch.int32))
