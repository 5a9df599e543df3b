"""gRPC over TLS with Triton's options (``--grpc-use-ssl``, ``--grpc-use-ssl-mutual``,
``--grpc-server-cert``, ``--grpc-server-key``, ``--grpc-root-cert``) on both transports, through
tritonclient: inference over TLS, plaintext refused, client certificates required and checked
in mutual mode, and the options checked when the server starts."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent
TRANSPORTS = ["native", "grpcio"]


@dataclass(frozen=True)
class Pki:
    ca: Path  # CA certificate (PEM)
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by ``ca``
    client_key: Path
    rogue_cert: Path  # a client certificate signed by another CA
    rogue_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool = False, server: bool = False,
) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca, _ = _write(folder, "ca", _issue("test CA", ca_key, "test CA", ca_key, ca=True), ca_key)
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("server", "client", "rogue")}
    server = _write(
        folder, "server", _issue("localhost", keys["server"], "test CA", ca_key, server=True), keys["server"]
    )
    client = _write(folder, "client", _issue("client", keys["client"], "test CA", ca_key), keys["client"])
    rogue = _write(folder, "rogue", _issue("rogue", keys["rogue"], "rogue CA", rogue_ca_key), keys["rogue"])
    return Pki(ca, *server, *client, *rogue)


def _tls_args(pki: Pki, transport: str, mutual: bool = False) -> list[str]:
    mode = ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={pki.ca}"] if mutual else ["--grpc-use-ssl=true"]
    return [
        f"--grpc-server={transport}",
        *mode,
        f"--grpc-server-cert={pki.server_cert}",
        f"--grpc-server-key={pki.server_key}",
    ]


def _infer_simple(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs, client_timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _refused(url: str, **tls: Any) -> str:
    """What a client that cannot complete the handshake is told (it must not get an answer)."""
    with (
        grpcclient.InferenceServerClient(url, **tls) as client,
        pytest.raises(InferenceServerException) as info,
    ):
        client.is_server_live(client_timeout=10)
    return str(info.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tls_serves_inference_and_refuses_plaintext(server_factory: Any, pki: Pki, transport: str) -> None:
    proc = server_factory.start(*_tls_args(pki, transport), listeners="grpc")
    with grpcclient.InferenceServerClient(proc.grpc_url, ssl=True, root_certificates=str(pki.ca)) as client:
        assert client.is_server_live()
        _infer_simple(client)
    _refused(proc.grpc_url)  # plaintext gRPC to a TLS port
    # a client that trusts another CA does not accept the server's certificate
    _refused(proc.grpc_url, ssl=True, root_certificates=str(pki.rogue_cert))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mutual_tls_needs_a_client_certificate_the_root_verifies(
    server_factory: Any, pki: Pki, transport: str
) -> None:
    proc = server_factory.start(*_tls_args(pki, transport, mutual=True), listeners="grpc")
    trust = {"ssl": True, "root_certificates": str(pki.ca)}
    _refused(proc.grpc_url, **trust)  # no client certificate
    _refused(proc.grpc_url, **trust, private_key=str(pki.rogue_key), certificate_chain=str(pki.rogue_cert))
    with grpcclient.InferenceServerClient(
        proc.grpc_url, **trust, private_key=str(pki.client_key), certificate_chain=str(pki.client_cert)
    ) as client:
        assert client.is_server_live()
        _infer_simple(client)


def _serve_fails(*args: str) -> str:
    cmd = [sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", "--http-port=-1"]
    cmd += ["--metrics-port=-1", "--grpc-port=0", "--model-repository", str(ROOT / "model_repository"), *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


def test_tls_options_are_checked_when_the_server_starts(pki: Pki, tmp_path: Path) -> None:
    cert, key = f"--grpc-server-cert={pki.server_cert}", f"--grpc-server-key={pki.server_key}"
    assert "--grpc-root-cert" in _serve_fails("--grpc-use-ssl-mutual", cert, key)
    assert "--grpc-server-key" in _serve_fails("--grpc-use-ssl=true", cert)
    assert "without --grpc-use-ssl" in _serve_fails(cert, key)
    missing = tmp_path / "missing.crt"
    assert f"--grpc-server-cert {missing}: no such file" in _serve_fails(
        "--grpc-use-ssl", f"--grpc-server-cert={missing}", key
    )
    # a key that is not the certificate's
    assert "cannot use them" in _serve_fails("--grpc-use-ssl", cert, f"--grpc-server-key={pki.client_key}")
    assert "expected true or false" in _serve_fails("--grpc-use-ssl=maybe", cert, key)
