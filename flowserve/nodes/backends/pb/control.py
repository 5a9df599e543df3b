"""Model control from model.py: ``load_model``, ``unload_model``, ``is_model_ready``."""

from __future__ import annotations

from flowserve.nodes.backends.pb.link import _need_link


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository, as Triton's model control API."""
    if model_name is None or config is None:
        raise TypeError("load_model(): model_name and config must not be None")
    _need_link("pb_utils.load_model()").load_model(model_name, config, dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    if model_name is None:
        raise TypeError("unload_model(): model_name must not be None")
    _need_link("pb_utils.unload_model()").unload_model(model_name, bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    if model_name is None or model_version is None:
        raise TypeError("is_model_ready(): model_name and model_version must not be None")
    return _need_link("pb_utils.is_model_ready()").is_model_ready(model_name, str(model_version))
