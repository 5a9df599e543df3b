"""Layer 6: transport front ends (HTTP/REST, gRPC), thin translators over the data plane.

The servers each protocol can run on are named here, in a module that imports nothing, so
the command line can offer them without importing the servers themselves."""

# the first of each is the default
HTTP_SERVERS = ("native", "uvicorn")  # http/http1.py, or uvicorn with httptools
GRPC_SERVERS = ("native", "grpcio")  # grpc/http2.py, or grpc.aio
