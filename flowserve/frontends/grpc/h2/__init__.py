"""flowserve's HTTP/2 transport for gRPC, one concern a module (``http2`` re-exports the names
other modules use, and its docstring says what is covered and bounded):

- ``frames``: frame types, flags, error codes, settings, the frame header codec, ``H2Error``
- ``limits``: windows, frame/header sizes, budgets, token buckets, timeouts, the rate-limited log
- ``headers``: HPACK request header blocks within bounds, constant response blocks, ``CallContext``
- ``calls``: ``Method``, a stream's state, markers of messages inflating or parsing in a thread
- ``compression``: request inflation within bounds, ``ResponseCompression``
- ``sending``: the send queue, flow control toward the peer, batched writes, the unsent budget
- ``receiving``: request DATA, the receive windows given back, request messages (large ones into
  their own buffers), parsed or inflated on the loop or in a thread
- ``running``: unary and streaming calls run, their deadlines and final status
- ``connection``: the ``asyncio.Protocol``: reads, frames in, header blocks, control frames,
  timers, eviction, connection errors, graceful stop
- ``server``: ``Http2GrpcServer`` (listener, server-wide budgets) and ``service_methods``
"""
