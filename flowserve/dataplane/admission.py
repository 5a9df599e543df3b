"""Admission control: how many requests may be in flight, server-wide and per model.

Every inference request (unary or streamed, from either front end) takes a slot when it
enters the data plane and gives it back when its last response is out. When the server or
the model is at its bound, the request fails at once with UNAVAILABLE (HTTP 503, gRPC
UNAVAILABLE) instead of joining an ever longer line: under a load far above capacity, latency
stays bounded by ``bound x service time`` and the answer to the rest is a fast refusal, which
is what a load balancer or a client with retries needs. Requests a model makes to another
(ensemble steps, BLS) do not take slots, so a pipeline cannot deadlock on its own bound.

Two integer comparisons and a dict update per request; 0 means "no bound".
"""

from __future__ import annotations

from flowserve.core.errors import Unavailable

DEFAULT_MAX_IN_FLIGHT = 4096
DEFAULT_MAX_IN_FLIGHT_PER_MODEL = 1024


class Admission:
    def __init__(
        self,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_per_model: int = DEFAULT_MAX_IN_FLIGHT_PER_MODEL,
    ) -> None:
        if max_in_flight < 0 or max_per_model < 0:
            raise ValueError("in-flight bounds must be >= 0 (0: no bound)")
        self.max_in_flight = max_in_flight
        self.max_per_model = max_per_model
        self.in_flight = 0
        self.rejected = 0
        self._per_model: dict[str, int] = {}

    def enter(self, model: str) -> None:
        """Take a slot for a request to ``model``, or raise Unavailable at once."""
        if self.max_in_flight and self.in_flight >= self.max_in_flight:
            self.rejected += 1
            raise Unavailable(
                f"server overloaded: {self.in_flight} requests in flight, the limit "
                f"(--max-inflight-requests {self.max_in_flight}); retry later"
            )
        per_model = self._per_model
        count = per_model.get(model, 0)
        if self.max_per_model and count >= self.max_per_model:
            self.rejected += 1
            raise Unavailable(
                f"model '{model}' overloaded: {count} requests in flight, the limit "
                f"(--max-inflight-per-model {self.max_per_model}); retry later"
            )
        per_model[model] = count + 1
        self.in_flight += 1

    def of(self, model: str) -> int:
        """Requests to ``model`` in flight now."""
        return self._per_model.get(model, 0)

    def leave(self, model: str) -> None:
        self.in_flight -= 1
        count = self._per_model[model] - 1
        if count:
            self._per_model[model] = count
        else:
            del self._per_model[model]

    def model_in_flight(self, model: str) -> int:
        return self._per_model.get(model, 0)
