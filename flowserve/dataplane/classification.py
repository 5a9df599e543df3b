"""Triton's classification extension: an output returned as its top-k "score:index[:label]"."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from flowserve.core.errors import InvalidArgument


@lru_cache(maxsize=64)
def read_labels(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text().splitlines())
    except OSError:
        return ()


def classify(array: np.ndarray, k: int, batched: bool, labels: tuple[str, ...], name: str) -> np.ndarray:
    """Top-``k`` entries of each row (or of the whole tensor when not batched), as BYTES."""
    if array.dtype.kind not in "iuf" and array.dtype.name != "bfloat16":
        raise InvalidArgument(f"classification requires a numeric output; '{name}' is {array.dtype}")
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim > 0 else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows.astype(np.float64)):
        order = np.argsort(-row, kind="stable")[:k]
        for j, idx in enumerate(order):
            text = f"{row[idx]:f}:{idx}"
            if idx < len(labels):
                text += f":{labels[idx]}"
            out[r, j] = text.encode()
    return out if batched else out.reshape(k)
