from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from tests.llm.tinymodel import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llm"))
