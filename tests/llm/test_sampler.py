"""flowserve's per-request sampler for the transformers engine (pure tensors, no engine):
greedy rows, temperature, top-k, top-p, per-request seeds and log-probabilities."""

from __future__ import annotations

from typing import Any

import pytest

from flowserve.nodes.llm.engine import Ranked, Sampling
from flowserve.nodes.llm.sampler import GREEDY, Row, RowSampler, row_for, sample_rows, score_rows

torch = pytest.importorskip("torch")


def logits(rows: int = 4, vocab: int = 50, seed: int = 0) -> Any:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def seeded(seed: int) -> Row:
    return row_for(torch, Sampling(temperature=1.0, seed=seed), "cpu")


def test_greedy_rows_are_the_argmax() -> None:
    x = logits()
    tokens = sample_rows(torch, x, [GREEDY] * 4)
    assert tokens.tolist() == x.argmax(-1).tolist()
    # rows the table does not name are greedy; top-k 1 is greedy whatever the temperature
    assert row_for(torch, Sampling(temperature=0.7, top_k=1), "cpu").greedy
    tokens = sample_rows(torch, x, [])
    assert tokens.tolist() == x.argmax(-1).tolist()


def test_a_seed_gives_the_same_tokens_whatever_the_batch() -> None:
    x = logits(rows=3)
    draws = []
    for _ in range(2):
        row = seeded(7)
        draws.append([int(sample_rows(torch, x[1:2], [row])[0]) for _ in range(20)])
    assert draws[0] == draws[1]
    # the same request among other rows (greedy and sampled ones) draws the same tokens
    row = seeded(7)
    mixed = [int(sample_rows(torch, x[[0, 1, 2]], [GREEDY, row, Row(1.0)])[1]) for _ in range(20)]
    assert mixed == draws[0]
    other = seeded(8)
    assert [int(sample_rows(torch, x[1:2], [other])[0]) for _ in range(20)] != draws[0]


def test_top_k_and_top_p_keep_only_the_likeliest_tokens() -> None:
    x = logits(rows=1, vocab=100)
    ranked = x[0].argsort(descending=True).tolist()
    top2 = {int(sample_rows(torch, x, [Row(5.0, top_k=2)])[0]) for _ in range(200)}
    assert top2 == set(ranked[:2])
    # top_p that the first token's mass already covers: always that token
    probs = x[0].softmax(-1)
    p = float(probs.max()) * 0.9
    assert {int(sample_rows(torch, x, [Row(1.0, top_p=p)])[0]) for _ in range(50)} == {ranked[0]}
    # top-p keeps the smallest prefix of the ranking whose mass reaches p
    mass = probs[ranked].cumsum(0)
    p = float(mass[2]) - 1e-4  # the first three tokens are needed to reach it
    drawn = {int(sample_rows(torch, x, [Row(1.0, top_p=p)])[0]) for _ in range(300)}
    assert drawn <= set(ranked[:3]) and len(drawn) > 1


def test_log_probabilities_are_the_models_own_with_ranks_and_the_likeliest() -> None:
    """As vLLM reports them by default: the log-softmax of the logits whatever the sampling
    (a greedy token's is below 0), the token's rank among them, the N most likely; computed only
    for the rows that ask."""
    x = logits(rows=3, vocab=30)
    rows = [
        row_for(torch, Sampling(temperature=0, logprobs=0), "cpu"),
        GREEDY,
        Row(0.5, top_k=5, logprobs=3),
    ]
    tokens = sample_rows(torch, x, rows)
    scored = score_rows(torch, x, tokens, rows)
    assert set(scored) == {0, 2}
    own = x.log_softmax(-1)
    value, ranked = scored[0]
    assert value == pytest.approx(float(own[0].max()), abs=1e-5) and value < 0
    assert ranked == Ranked(1, ())
    value, ranked = scored[2]
    token = int(tokens[2])
    assert value == pytest.approx(float(own[2, token]), abs=1e-5)
    order = own[2].argsort(descending=True).tolist()
    assert ranked.rank == order.index(token) + 1 and ranked.rank <= 5  # top-k 5 drew it
    assert [t for t, _ in ranked.top] == order[:3]
    assert [v for _, v in ranked.top] == pytest.approx(own[2, order[:3]].tolist(), abs=1e-5)


def test_the_sampler_queues_each_asking_requests_ranks_in_token_order() -> None:
    """RowSampler in place of the model runner's step: tokens in row 0 of the output, their
    log-probabilities' bits in row 1, and a Ranked per token on the queue of a request that
    asks (the engine's reader pops one per token)."""

    class State:
        def __init__(self, request_id: str) -> None:
            self.request_id = request_id

    class Future:
        def __init__(self, request_id: str) -> None:
            self.state = State(request_id)
            self.has_new_token = True

    class Batch:
        requests_in_batch = [Future("a"), Future("b")]

    sampler = RowSampler(torch, Batch())
    sampler.rows["b"] = row_for(torch, Sampling(temperature=0, logprobs=2), "cpu")
    from collections import deque

    sampler.ranked["b"] = deque()
    x = logits(rows=2, vocab=20)
    for step in range(3):
        out = torch.zeros(2, 4, dtype=torch.int32)
        sampler(x.unsqueeze(0), out)
        assert out[0, :2].tolist() == x.argmax(-1).tolist()
        values = out[1, :2].view(torch.float32).tolist()
        assert values[0] == 0.0 and values[1] == pytest.approx(float(x[1].log_softmax(-1).max()), abs=1e-5)
        assert len(sampler.ranked["b"]) == step + 1
    assert all(r.rank == 1 and len(r.top) == 2 for r in sampler.ranked["b"])
