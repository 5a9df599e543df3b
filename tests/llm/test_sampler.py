"""flowserve's per-request sampler for the transformers engine (pure tensors, no engine):
greedy rows, temperature, top-k, top-p, per-request seeds and log-probabilities."""

from __future__ import annotations

from typing import Any

import pytest

from flowserve.nodes.llm.engine import Sampling
from flowserve.nodes.llm.sampler import GREEDY, Row, row_for, sample_rows

torch = pytest.importorskip("torch")


def logits(rows: int = 4, vocab: int = 50, seed: int = 0) -> Any:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def seeded(seed: int) -> Row:
    return row_for(torch, Sampling(temperature=1.0, seed=seed), "cpu")


def test_greedy_rows_are_the_argmax_with_log_probability_zero() -> None:
    x = logits()
    tokens, logprobs = sample_rows(torch, x, [GREEDY] * 4)
    assert tokens.tolist() == x.argmax(-1).tolist()
    assert logprobs.tolist() == [0.0] * 4
    # rows the table does not name are greedy; top-k 1 is greedy whatever the temperature
    assert row_for(torch, Sampling(temperature=0.7, top_k=1), "cpu").greedy
    tokens, _ = sample_rows(torch, x, [])
    assert tokens.tolist() == x.argmax(-1).tolist()


def test_a_seed_gives_the_same_tokens_whatever_the_batch() -> None:
    x = logits(rows=3)
    draws = []
    for _ in range(2):
        row = seeded(7)
        draws.append([int(sample_rows(torch, x[1:2], [row])[0][0]) for _ in range(20)])
    assert draws[0] == draws[1]
    # the same request among other rows (greedy and sampled ones) draws the same tokens
    row = seeded(7)
    mixed = [int(sample_rows(torch, x[[0, 1, 2]], [GREEDY, row, Row(1.0)])[0][1]) for _ in range(20)]
    assert mixed == draws[0]
    other = seeded(8)
    assert [int(sample_rows(torch, x[1:2], [other])[0][0]) for _ in range(20)] != draws[0]


def test_top_k_and_top_p_keep_only_the_likeliest_tokens() -> None:
    x = logits(rows=1, vocab=100)
    ranked = x[0].argsort(descending=True).tolist()
    top2 = {int(sample_rows(torch, x, [Row(5.0, top_k=2)])[0][0]) for _ in range(200)}
    assert top2 == set(ranked[:2])
    # top_p that the first token's mass already covers: always that token
    probs = x[0].softmax(-1)
    p = float(probs.max()) * 0.9
    assert {int(sample_rows(torch, x, [Row(1.0, top_p=p)])[0][0]) for _ in range(50)} == {ranked[0]}
    # top-p keeps the smallest prefix of the ranking whose mass reaches p
    mass = probs[ranked].cumsum(0)
    p = float(mass[2]) - 1e-4  # the first three tokens are needed to reach it
    drawn = {int(sample_rows(torch, x, [Row(1.0, top_p=p)])[0][0]) for _ in range(300)}
    assert drawn <= set(ranked[:3]) and len(drawn) > 1


def test_log_probabilities_are_of_the_distribution_drawn_from() -> None:
    x = logits(rows=2, vocab=30)
    row = Row(0.5, top_k=5)
    tokens, logprobs = sample_rows(torch, x, [GREEDY, row])
    scaled = x[1] / 0.5
    kth = scaled.topk(5).values[-1]
    expected = scaled.masked_fill(scaled < kth, float("-inf")).log_softmax(-1)[tokens[1]]
    assert float(logprobs[1]) == pytest.approx(float(expected), abs=1e-5)
    assert float(logprobs[0]) == 0.0
