"""Layer 6: the transport-neutral data plane both front ends (and embedders) call."""

from flowserve.dataplane.engine import Engine

__all__ = ["Engine"]
