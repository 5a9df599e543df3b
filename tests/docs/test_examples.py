"""examples/graph_client.py against a real server of the bundled graphs (fanout, repeat), as the
docs' client page shows it (docs/howto/clients.md includes the file itself)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, ROOT, start_server

EXAMPLE = ROOT / "examples" / "graph_client.py"


@pytest.mark.slow
def test_graph_client_example_calls_the_bundled_graphs() -> None:
    server = start_server(
        "--model-control-mode=explicit",
        "--load-model=fanout",
        "--load-model=repeat",
        repositories=(BUNDLED_REPOSITORY,),
        graphs=(BUNDLED_GRAPHS,),
    )
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--http", server.http_url, "--grpc", server.grpc_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nserver:\n{server.log()}"
    # total = 5a - b with a = 0..15, b = 1 (the script asserts every element itself)
    assert "HTTP fanout: total[0][:4] = [-1, 4, 9, 14]" in done.stdout
    assert "gRPC fanout: total[0][:4] = [-1, 4, 9, 14]" in done.stdout
    for i in range(3):
        assert f"gRPC stream repeat: response {i}: y = [10, 20, 30]" in done.stdout
