"""TLS for the gRPC front end, as Triton's ``--grpc-use-ssl`` options give it.

::

    tls = GrpcTls.load(cert, key)                                  # server-side TLS
    tls = GrpcTls.load(cert, key, root_cert=ca, mutual=True)       # clients must present a cert
    listener = await start_grpc(plane, host, port, tls=tls)

The server presents ``cert`` (a PEM certificate chain) with its private ``key``. With
``mutual``, the handshake fails unless the client presents a certificate that ``root_cert``
(PEM CA certificates) verifies. ``load`` reads and checks the files once, at startup, so a
missing file, a key that does not match its certificate or a mutual setting without CA
certificates stops the server with a message naming the option, not the first client.

Both transports take it: the native one through an :class:`ssl.SSLContext` on the loop's
server (TLS 1.2 or later, ALPN ``h2``, which gRPC clients require), grpcio through its server
credentials. Triton's HTTP endpoint has no TLS (it is meant to sit behind a proxy), nor has
flowserve's.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True, slots=True)
class GrpcTls:
    cert: Path
    key: Path
    root_cert: Path | None = None
    mutual: bool = False

    @classmethod
    def load(
        cls, cert: str | Path | None, key: str | Path | None, root_cert: str | Path | None = None,
        mutual: bool = False,
    ) -> GrpcTls:  # fmt: skip
        """Checked settings; ValueError naming the option when something is missing or wrong."""
        if not cert or not key:
            raise ValueError("gRPC TLS needs --grpc-server-cert and --grpc-server-key (PEM files)")
        if mutual and not root_cert:
            raise ValueError(
                "--grpc-use-ssl-mutual needs --grpc-root-cert: the CA certificates that verify clients"
            )
        files = {"--grpc-server-cert": Path(cert), "--grpc-server-key": Path(key)}
        if root_cert:
            files["--grpc-root-cert"] = Path(root_cert)
        for option, path in files.items():
            if not path.is_file():
                raise ValueError(f"{option} {path}: no such file")
        tls = cls(Path(cert), Path(key), Path(root_cert) if root_cert else None, mutual)
        tls.ssl_context()  # reads every file: unreadable or mismatched ones fail here
        return tls

    def ssl_context(self) -> ssl.SSLContext:
        """The native transport's server context."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"--grpc-server-cert {self.cert} / --grpc-server-key {self.key}: cannot use them ({exc})"
            ) from None
        if self.root_cert is not None:
            try:
                context.load_verify_locations(cafile=self.root_cert)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"--grpc-root-cert {self.root_cert}: cannot use it ({exc})") from None
        if self.mutual:
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["h2"])
        return context

    def credentials(self) -> grpc.ServerCredentials:
        """grpcio's server credentials for the same settings."""
        root = self.root_cert.read_bytes() if self.root_cert is not None and self.mutual else None
        pair = (self.key.read_bytes(), self.cert.read_bytes())
        return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=self.mutual)
