"""Token ids in, text out: incremental detokenization with stop strings (pure).

Each step decodes only a short window of the newest ids (the ids since the last emitted text,
plus the few before them that a tokenizer needs for word boundaries), so a token costs the same
at position 10 and 1000. Text that may still change is held back: an incomplete UTF-8 sequence
(the decoder's U+FFFD) and a tail that could be the start of a stop string. A stop string ends
the text before it (it is not part of the output, as in OpenAI's API and vLLM), or after it with
``include_stop`` (vLLM's ``include_stop_str_in_output``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class TextStream:
    def __init__(self, decode: Decode, stops: Sequence[str] = (), include_stop: bool = False) -> None:
        self._decode = decode
        self._stops = tuple(stops)
        self._include = include_stop
        self._longest = max((len(s) for s in self._stops), default=0)
        self.ids: list[int] = []
        self._prefix = 0  # window start: ids before it are settled text
        self._read = 0  # ids up to here are in ``text``
        self.text = ""  # decoded so far (settled)
        self._sent = 0  # characters of ``text`` handed out
        self.stopped = False

    def push(self, ids: Sequence[int]) -> str:
        """Add new ids; the text that is now safe to hand out ("" when none). After a stop
        string matched, :attr:`stopped` is True and later pushes return ""."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The sequence ended: whatever was held back (no stop string can complete now)."""
        if self.stopped:
            return ""
        if self._read < len(self.ids):  # an incomplete character at the very end: as decoded
            after = self._decode(self.ids[self._prefix :])
            before = self._decode(self.ids[self._prefix : self._read])
            self.text += after[len(before) :]
            self._read = len(self.ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text = self.text
        if self._stops:
            start = max(0, self._sent - self._longest + 1)
            hits = [(i, len(s)) for i, s in ((text.find(s, start), s) for s in self._stops) if i >= 0]
            if hits:
                at, length = min(hits)
                end = at + length if self._include else at
                self.stopped = True
                self.text = text[:end]
                out = text[self._sent : end] if end > self._sent else ""
                self._sent = max(self._sent, end)
                return out
        end = len(text) if final else len(text) - self._held(text)
        if end <= self._sent:
            return ""
        out = text[self._sent : end]
        self._sent = end
        return out

    def _held(self, text: str) -> int:
        """How many trailing characters could begin a stop string."""
        for n in range(min(self._longest - 1, len(text) - self._sent), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0
