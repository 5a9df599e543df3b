"""flowserve: a dataflow inference server where ensembles are first-class.

Public surface::

    engine = await flowserve.Engine.start("model_repository", "graphs")
    outputs = await engine.infer("simple", {"INPUT0": a, "INPUT1": b})
"""

from flowserve.core.errors import ErrorCode, FlowserveError, NodeError, SpecError
from flowserve.core.node import Context, Node
from flowserve.core.version import VERSION
from flowserve.dataplane.engine import Engine
from flowserve.repository.settings import RepositorySettings

__all__ = [
    "Context",
    "Engine",
    "ErrorCode",
    "FlowserveError",
    "Node",
    "NodeError",
    "RepositorySettings",
    "SpecError",
]
__version__ = VERSION
