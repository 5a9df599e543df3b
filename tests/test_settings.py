"""The settings object: one set of defaults, fed by the environment and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowserve import cli
from flowserve.core.errors import InvalidArgument
from flowserve.repository.settings import RepositorySettings
from flowserve.settings import Settings


def test_defaults_are_defined_once_and_the_cli_uses_them() -> None:
    args = cli.build_parser(Settings()).parse_args(["serve"])
    d = Settings()
    assert (args.http_port, args.grpc_port, args.metrics_port) == (d.http_port, d.grpc_port, d.metrics_port)
    assert args.model_control_mode == d.repository.control_mode == "none"  # Triton's default
    assert args.repository_poll_secs == d.repository.poll_secs
    assert args.model_load_thread_count == d.repository.model_load_threads
    assert args.inline_threshold_us == d.repository.inline_threshold_us
    assert args.max_request_bytes == d.limits.max_request_bytes
    assert args.exit_timeout_secs == d.shutdown_grace_s
    assert args.allow_shm is d.allow_shm is True  # as in Triton


def test_environment_feeds_the_settings_and_the_flag_wins() -> None:
    env = {
        "FLOWSERVE_HTTP_PORT": "9100",
        "FLOWSERVE_ALLOW_SHM": "false",
        "FLOWSERVE_HTTP_MAX_JSON_BYTES": "1024",
        "FLOWSERVE_REPOSITORY_CONTROL_MODE": "poll",
        "FLOWSERVE_REPOSITORY_POLL_SECS": "2.5",
        "UNRELATED": "x",
    }
    settings = Settings.from_env(env)
    assert settings.http_port == 9100 and settings.allow_shm is False and settings.http_max_json_bytes == 1024
    assert settings.repository.control_mode == "poll" and settings.repository.poll_secs == 2.5
    args = cli.build_parser(settings).parse_args(["serve", "--http-port", "9200"])
    assert args.http_port == 9200  # the flag
    assert args.model_control_mode == "poll" and args.allow_shm is False  # the environment


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLOWSERVE_HTTP_PORT": "eighty"}, "FLOWSERVE_HTTP_PORT='eighty': expected int"),
        ({"FLOWSERVE_ALLOW_SHM": "maybe"}, "FLOWSERVE_ALLOW_SHM='maybe': expected bool"),
        ({"FLOWSERVE_REPOSITORY_CONTROL_MODE": "sometimes"}, "model control mode must be one of"),
        ({"FLOWSERVE_LIMITS": "1"}, "cannot be set from the environment"),
    ],
)
def test_bad_environment_values_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Settings.from_env(env)


def test_cli_reports_a_bad_environment_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLOWSERVE_GRPC_PORT", "x")
    assert cli.main(["validate", str(Path(__file__).parent)]) == 2
    assert "FLOWSERVE_GRPC_PORT" in capsys.readouterr().err


def test_repository_settings_check_their_values() -> None:
    assert RepositorySettings().loads_at_start() is None  # none mode: everything
    assert RepositorySettings(control_mode="explicit").loads_at_start() == set()
    assert RepositorySettings(control_mode="explicit", load_models=("*",)).loads_at_start() is None
    assert RepositorySettings(control_mode="explicit", load_models=("a",)).loads_at_start() == {"a"}
    for bad in (
        {"control_mode": "x"},
        {"model_load_threads": 0},
        {"poll_secs": 0},
        {"inline_threshold_us": -1},
    ):
        with pytest.raises(InvalidArgument):
            RepositorySettings(**bad)  # type: ignore[arg-type]
