"""The one version string of flowserve (pyproject.toml reads it; server metadata and OTLP report it)."""

VERSION = "0.1.0"
