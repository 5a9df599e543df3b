"""Triton's HTTP/REST protocol (KServe V2 with Triton's extensions) over the data plane.

::

    listener = await start_http(plane, "0.0.0.0", 8000, mounts={"/ui": ui_app})
    ...
    await listener.stop(grace_s=30)

A raw ASGI callable (:class:`HttpApp`) served in the running event loop by flowserve's own
HTTP/1.1 server (``http1.py``, the default) or by uvicorn with httptools (``server="uvicorn"``);
``mounts`` delegates every request under a path prefix to another ASGI app.
"""

from __future__ import annotations

from flowserve.frontends import HTTP_SERVERS
from flowserve.frontends.http.app import HttpApp
from flowserve.frontends.http.asgi import ASGIApp
from flowserve.frontends.http.listener import HttpListener, start_http

__all__ = ["HTTP_SERVERS", "ASGIApp", "HttpApp", "HttpListener", "start_http"]
