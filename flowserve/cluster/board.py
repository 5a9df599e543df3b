"""The load board: requests in flight per worker and model, in memory every worker maps.

One small file in the server's directory (made by the supervisor before it starts the
workers): a table of ``workers x SLOTS`` int64 counts. A model's column is a stable hash of its
name (two models that share a column only make both look busier). Each worker writes only its
own row, as its requests enter and leave (:class:`BoardAdmission`, one store per change), and
reads every row when it decides where a request runs (``cluster/routing.py``): what it sees is
the other workers' counts as they are now, not as a reply last said. No locks: a count is one
aligned 8-byte store, and a decision made on a count one request old is still a good one.
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path

import numpy as np

from flowserve.dataplane.admission import Admission

BOARD_FILE = "load.board"
SLOTS = 4096  # model columns


def create(path: Path, workers: int) -> None:
    """Make the board file for ``workers`` workers (all counts 0)."""
    with path.open("wb") as f:
        f.truncate(workers * SLOTS * 8)


class Board:
    """A worker's view of the board: its own row to write, every row to read."""

    def __init__(self, path: Path, workers: int, index: int) -> None:
        size = workers * SLOTS * 8
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.index = index
        self.table = np.ndarray((workers, SLOTS), np.int64, buffer=self._memory)
        self.table[index] = 0  # a restarted worker starts with nothing in flight
        self._row = self.table[index]
        self._columns: dict[str, int] = {}

    def column(self, model: str) -> int:
        found = self._columns.get(model)
        if found is None:
            found = self._columns[model] = zlib.crc32(model.encode()) % SLOTS
        return found

    def put(self, model: str, count: int) -> None:
        """This worker has ``count`` requests of ``model`` in flight."""
        self._row[self.column(model)] = count

    def loads(self, model: str) -> list[int]:
        """Every worker's requests of ``model`` in flight, by worker index."""
        values: list[int] = self.table[:, self.column(model)].tolist()
        return values


class BoardAdmission(Admission):
    """Admission control that also writes this worker's counts to the board."""

    def __init__(self, board: Board, max_in_flight: int, max_per_model: int) -> None:
        super().__init__(max_in_flight, max_per_model)
        self.board = board

    def enter(self, model: str) -> None:
        super().enter(model)
        self.board.put(model, self.of(model))

    def leave(self, model: str) -> None:
        super().leave(model)
        self.board.put(model, self.of(model))


__all__ = ["BOARD_FILE", "SLOTS", "Board", "BoardAdmission", "create"]
