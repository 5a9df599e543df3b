"""Triton's HTTP/REST protocol (KServe V2 with Triton's extensions) over the data plane.

::

    listener = await start_http(plane, "0.0.0.0", 8000, mounts={"/ui": ui_app})
    ...
    await listener.stop(grace_s=30)

A raw ASGI callable (:class:`HttpApp`) served by uvicorn with httptools, as a task of the
running event loop; ``mounts`` delegates every request under a path prefix to another ASGI app.
"""

from __future__ import annotations

from flowserve.frontends.http.app import HttpApp
from flowserve.frontends.http.asgi import ASGIApp
from flowserve.frontends.http.listener import HttpListener, start_http

__all__ = ["ASGIApp", "HttpApp", "HttpListener", "start_http"]
