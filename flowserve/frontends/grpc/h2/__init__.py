"""flowserve's HTTP/2 transport for gRPC, one concern a module (``http2`` re-exports the names
other modules use, and its docstring says what is covered and bounded):

- ``frames``: frame types, flags, error codes, settings, the frame header codec, ``H2Error``
- ``limits``: windows, frame/header sizes, budgets, token buckets, timeouts, the rate-limited log
- ``headers``: HPACK request header blocks within bounds, constant response blocks, ``CallContext``
- ``calls``: ``Method``, a stream's state, markers of messages inflating or parsing in a thread
- ``compression``: request inflation within bounds, ``ResponseCompression``
- ``sending``: the send queue, flow control toward the peer, batched writes, the unsent budget
- ``connection``: the ``asyncio.Protocol``: frames in, data and its flow control, calls, timers
- ``server``: ``Http2GrpcServer`` (listener, server-wide budgets) and ``service_methods``
"""
