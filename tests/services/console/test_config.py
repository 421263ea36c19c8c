"""The console's options (no cluster): every flag documented in docs/configuration.md,
the TIDE_CONSOLE_* environment under the flags, and bad values refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.console.config import ENV_PREFIX, ConfigError, from_args, parser

CONFIG_DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_every_option_is_documented_with_its_variable() -> None:
    section = CONFIG_DOC.read_text().split("## console (`python -m services.console`)")[1]
    for action in parser()._actions:
        if action.dest == "help":
            continue
        flag = action.option_strings[0]
        row = f"| `{flag}` |"
        assert row in section, f"docs/configuration.md: no row for {flag}"
        assert f"`{ENV_PREFIX}{action.dest.upper()}`" in section, flag


def test_the_environment_sets_defaults_and_flags_outrank_it() -> None:
    env = {
        "TIDE_CONSOLE_GATEWAY": "gw:1",
        "TIDE_CONSOLE_GATEWAY_TLS": "yes",
        "TIDE_CONSOLE_METRICS_ENDPOINT": "gateway=h:1,broker-a=h:2",
        "TIDE_CONSOLE_PAGE_SIZE_ROWS": "5",
    }
    config = from_args([], env)
    assert config.gateway == "gw:1" and config.gateway_tls is True
    assert config.metrics_endpoints == (("gateway", "h:1"), ("broker-a", "h:2"))
    assert config.page_size_rows == 5
    assert from_args(["--gateway", "other:2"], env).gateway == "other:2"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--session-max-age-s", "0"], "--session-max-age-s is 0"),
        (["--rpc-timeout-ms", "-1"], "--rpc-timeout-ms is -1"),
        (["--listen", "h:99999"], "--listen 'h:99999' is not HOST:PORT"),
        (["--metrics-endpoint", "=h:1"], "is not NAME=HOST:PORT"),
    ],
)
def test_bad_values_name_the_option(argv: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        from_args(argv, {})
