"""Option parsing: precedence flag > env > config file > default, help text, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tide.server import COMMON_OPTIONS, Config, Option, load_config
from tide.server._config import build_parser, merge_options

OPTIONS = (
    Option("flush_interval_ms", int, 500, "how often to flush", unit="ms"),
    Option("sync_flush", bool, False, "flush before answering"),
    Option("disk_ratio", float, 0.75, "refuse writes above this disk usage"),
    Option("flush_mode", str, "async", "flush policy", choices=("async", "sync")),
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for opt in [*OPTIONS, *COMMON_OPTIONS]:
        monkeypatch.delenv(opt.env_var("storage"), raising=False)


def load(argv: list[str]) -> Config:
    return load_config("storage", OPTIONS, argv)


def write_config(tmp_path: Path, suffix: str, values: dict[str, object]) -> Path:
    path = tmp_path / f"tide{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(values), encoding="utf-8")
    else:
        lines = [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # JSON scalars are TOML
    return path


def test_defaults_when_nothing_is_given() -> None:
    config = load([])
    assert config.get_int("flush_interval_ms") == 500
    assert config.get_str("listen") == "127.0.0.1:0"
    assert config.get_str("log_level") == "info"
    assert config.get_float("shutdown_grace_s") == 10.0
    assert config.get_optional_str("otel_service_name") is None
    assert config.sources["flush_interval_ms"] == "default"


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_precedence_flag_over_env_over_file_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    path = write_config(tmp_path, suffix, {"flush_interval_ms": 300, "disk_ratio": 0.5})
    file_only = load(["--config", str(path)])
    assert file_only.get_int("flush_interval_ms") == 300
    assert file_only.get_float("disk_ratio") == 0.5
    assert file_only.sources["flush_interval_ms"] == "file"

    monkeypatch.setenv("TIDE_STORAGE_FLUSH_INTERVAL_MS", "200")
    with_env = load(["--config", str(path)])
    assert with_env.get_int("flush_interval_ms") == 200
    assert with_env.sources["flush_interval_ms"] == "env"
    assert with_env.get_float("disk_ratio") == 0.5

    with_flag = load(["--config", str(path), "--flush-interval-ms", "100"])
    assert with_flag.get_int("flush_interval_ms") == 100
    assert with_flag.sources["flush_interval_ms"] == "flag"


def test_config_path_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path, ".toml", {"log_level": "debug"})
    monkeypatch.setenv("TIDE_STORAGE_CONFIG", str(path))
    assert load([]).get_str("log_level") == "debug"


def test_bool_option_from_flag_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load(["--sync-flush"]).get_bool("sync_flush") is True
    path = write_config(tmp_path, ".toml", {"sync_flush": True})
    assert load(["--config", str(path), "--no-sync-flush"]).get_bool("sync_flush") is False
    monkeypatch.setenv("TIDE_STORAGE_SYNC_FLUSH", "yes")
    assert load([]).get_bool("sync_flush") is True


def test_int_in_file_is_accepted_for_float(tmp_path: Path) -> None:
    path = write_config(tmp_path, ".json", {"shutdown_grace_s": 3})
    config = load(["--config", str(path)])
    assert config.get_float("shutdown_grace_s") == 3.0


def test_help_shows_units_defaults_and_env_vars(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        load(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--flush-interval-ms INT how often to flush [unit: ms]" in text
    assert "(default: 500; env: TIDE_STORAGE_FLUSH_INTERVAL_MS)" in text
    assert "[unit: s] (default: 10.0; env: TIDE_STORAGE_SHUTDOWN_GRACE_S)" in text
    assert "--log-level {debug,info,warning,error}" in text
    assert "--sync-flush, --no-sync-flush" in text
    for flag in ("--listen HOST:PORT", "--log-format", "--otel-traces-exporter", "--config PATH"):
        assert flag in text


def test_build_parser_without_service_has_no_env_names() -> None:
    text = build_parser("prog", "desc", OPTIONS).format_help()
    assert "[unit: ms]" in text
    assert "TIDE_" not in text


def test_bad_flag_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load(["--flush-interval-ms", "abc"])
    assert exit_info.value.code == 2
    assert "--flush-interval-ms: expected an integer, got 'abc'" in capsys.readouterr().err


def test_bad_env_value_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDE_STORAGE_DISK_RATIO", "most")
    with pytest.raises(SystemExit):
        load([])
    assert "TIDE_STORAGE_DISK_RATIO: expected a number, got 'most'" in capsys.readouterr().err


def test_bad_choice_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load(["--log-level", "verbose"])
    err = capsys.readouterr().err
    assert "--log-level: expected one of debug, info, warning, error; got 'verbose'" in err


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_unknown_config_key_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    path = write_config(tmp_path, suffix, {"flush_interval_mss": 1})
    with pytest.raises(SystemExit) as exit_info:
        load(["--config", str(path)])
    assert exit_info.value.code == 2
    assert f"config file {path}: unknown key 'flush_interval_mss'" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_wrong_type_in_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    path = write_config(tmp_path, suffix, {"flush_interval_ms": "abc"})
    with pytest.raises(SystemExit):
        load(["--config", str(path)])
    err = capsys.readouterr().err
    assert f"config file {path}: key 'flush_interval_ms': expected an integer, got 'abc'" in err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.toml", None, "cannot read config file"),
        ("bad.toml", "flush_interval_ms = = 1", "bad.toml: "),
        ("list.json", "[1, 2]", "expected a table of option names"),
        ("tide.yaml", "a: 1", "expected a .toml or .json file"),
    ],
)
def test_unusable_config_files(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: str | None,
    message: str,
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit):
        load(["--config", str(path)])
    assert message in capsys.readouterr().err


def test_service_option_replaces_common_default() -> None:
    listen = Option("listen", str, "127.0.0.1:10911", "gRPC endpoint HOST:PORT")
    merged = merge_options((listen, *OPTIONS))
    assert [opt.name for opt in merged].count("listen") == 1
    config = load_config("storage", (listen,), [])
    assert config.get_str("listen") == "127.0.0.1:10911"


def test_option_definitions_are_validated() -> None:
    with pytest.raises(ValueError, match="snake_case"):
        Option("FlushInterval", int, 1, "x")
    with pytest.raises(ValueError, match="expected an integer"):
        Option("flush_interval_ms", int, "1", "x")
    with pytest.raises(ValueError, match="expected one of"):
        Option("mode", str, "fast", "x", choices=("a", "b"))
    with pytest.raises(ValueError, match="duplicate"):
        merge_options((OPTIONS[0], OPTIONS[0]))


def test_env_var_names() -> None:
    assert OPTIONS[0].env_var("storage") == "TIDE_STORAGE_FLUSH_INTERVAL_MS"
    assert OPTIONS[0].env_var("name-server") == "TIDE_NAME_SERVER_FLUSH_INTERVAL_MS"
    assert OPTIONS[0].flag == "--flush-interval-ms"


def test_typed_getters_reject_the_wrong_type() -> None:
    config = load([])
    with pytest.raises(TypeError):
        config.get_int("listen")
    with pytest.raises(TypeError):
        config.get_int("sync_flush")
    with pytest.raises(KeyError):
        config.get("nope")
