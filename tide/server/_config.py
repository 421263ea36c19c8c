"""Service configuration: command-line flags > environment > config file > defaults.

Each service declares its options as a tuple of :class:`Option`; :func:`load_config` adds
:data:`COMMON_OPTIONS`, parses ``argv`` and resolves every value with that precedence.

* flag: ``--flush-interval-ms 200`` (``--name`` / ``--no-name`` for booleans)
* environment: ``TIDE_<SERVICE>_<NAME>``, e.g. ``TIDE_STORAGE_FLUSH_INTERVAL_MS=200``
* config file: ``--config tide.toml`` (or ``.json``), keys are the option snake names
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tide.server._event_loop import EVENT_LOOPS

OptionValue = int | float | str | bool | None
OptionType = type[int] | type[float] | type[str] | type[bool]
_T = TypeVar("_T")

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_TYPE_WORDS: dict[type, str] = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "a boolean",
}
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A value that does not fit its option; the message names the option and the value."""


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration option. ``name`` is snake_case with the unit last (``flush_interval_ms``).

    ``default=None`` means "unset" (only ``str`` options should use it). ``env`` is derived:
    see :meth:`env_var`.
    """

    name: str
    type: OptionType
    default: OptionValue
    help: str
    unit: str | None = None
    choices: tuple[OptionValue, ...] | None = None

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"option name {self.name!r} is not snake_case")
        if self.type not in _TYPE_WORDS:
            raise ValueError(f"option {self.name}: unsupported type {self.type!r}")
        if self.default is not None:
            _check_type(self, self.default, f"option {self.name} default")
        for choice in self.choices or ():
            _check_type(self, choice, f"option {self.name} choice")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def env_var(self, service: str) -> str:
        """``TIDE_<SERVICE>_<NAME>``, e.g. ``TIDE_STORAGE_FLUSH_INTERVAL_MS``."""
        return f"TIDE_{_env_part(service)}_{self.name.upper()}"


@dataclass(frozen=True, slots=True)
class Config:
    """Resolved option values; ``sources`` says where each came from (flag/env/file/default)."""

    service: str
    values: Mapping[str, OptionValue]
    sources: Mapping[str, str]

    def get(self, name: str) -> OptionValue:
        if name not in self.values:
            raise KeyError(f"no option named {name!r}")
        return self.values[name]

    def get_str(self, name: str) -> str:
        return _typed(self, name, str)

    def get_optional_str(self, name: str) -> str | None:
        return None if self.get(name) is None else self.get_str(name)

    def get_int(self, name: str) -> int:
        return _typed(self, name, int)

    def get_float(self, name: str) -> float:
        return _typed(self, name, float)

    def int_out_of_range(self, ranges: Mapping[str, tuple[int, int]]) -> str | None:
        """The first int option outside its inclusive ``(low, high)``, as ``--flag: value is
        outside low..high`` (None: all inside)."""
        for name, (low, high) in ranges.items():
            value = self.get_int(name)
            if not low <= value <= high:
                return f"--{name.replace('_', '-')}: {value} is outside {low}..{high}"
        return None

    def get_bool(self, name: str) -> bool:
        return _typed(self, name, bool)


def _typed(config: Config, name: str, want: type[_T]) -> _T:
    value = config.get(name)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
        raise TypeError(f"option {name} is {value!r}, not {want.__name__}")
    return value


def merge_options(options: Sequence[Option]) -> tuple[Option, ...]:
    """COMMON_OPTIONS followed by ``options``; an option with a common name replaces it
    (e.g. to give ``listen`` a service-specific default)."""
    own = {opt.name: opt for opt in options}
    if len(own) != len(options):
        raise ValueError("duplicate option names")
    common = tuple(own.pop(opt.name, opt) for opt in COMMON_OPTIONS)
    return common + tuple(own.values())


def build_parser(
    prog: str, description: str, options: Sequence[Option], service: str | None = None
) -> argparse.ArgumentParser:
    """A parser with one ``--kebab-name`` per option; values default to "not given".

    With ``service``, each option's help names its environment variable.
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=description, argument_default=argparse.SUPPRESS
    )
    for opt in options:
        help_text = _help_text(opt, service)
        if opt.type is bool:
            parser.add_argument(opt.flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(
                opt.flag, type=_flag_converter(opt), metavar=_metavar(opt), help=help_text
            )
    return parser


def load_config(service: str, options: Sequence[Option], argv: Sequence[str] | None) -> Config:
    """Parse ``argv`` (``None``: ``sys.argv[1:]``) and resolve every option of ``service``.

    Bad values exit through ``argparse`` (status 2) with a message naming the flag,
    environment variable or config key.
    """
    all_options = merge_options(options)
    parser = build_parser(f"tide-{service}", f"Tide {service} service", all_options, service)
    given = vars(parser.parse_args(argv))
    try:
        return _resolve(service, all_options, given, os.environ)
    except ConfigError as exc:
        parser.error(str(exc))


def _resolve(
    service: str,
    options: Sequence[Option],
    given: Mapping[str, Any],
    environ: Mapping[str, str],
) -> Config:
    by_name = {opt.name: opt for opt in options}
    config_path = _pick(by_name["config"], service, given, environ, {})[0]
    file_values = _read_file(str(config_path), by_name) if config_path else {}
    values: dict[str, OptionValue] = {}
    sources: dict[str, str] = {}
    for opt in options:
        values[opt.name], sources[opt.name] = _pick(opt, service, given, environ, file_values)
    return Config(service=service, values=values, sources=sources)


def _pick(
    opt: Option,
    service: str,
    given: Mapping[str, Any],
    environ: Mapping[str, str],
    file_values: Mapping[str, OptionValue],
) -> tuple[OptionValue, str]:
    if opt.name in given:
        return given[opt.name], "flag"
    env_var = opt.env_var(service)
    if env_var in environ:
        return _parse_text(opt, environ[env_var], env_var), "env"
    if opt.name in file_values:
        return file_values[opt.name], "file"
    return opt.default, "default"


def _read_file(path: str, by_name: Mapping[str, Option]) -> dict[str, OptionValue]:
    data = _load_file(Path(path))
    values: dict[str, OptionValue] = {}
    for key, raw in data.items():
        opt = by_name.get(key)
        if opt is None or key == "config":
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        values[key] = _check_type(opt, raw, f"config file {path}: key {key!r}")
    return values


def _load_file(path: Path) -> dict[str, Any]:
    loaders: dict[str, Callable[[bytes], Any]] = {".toml": _toml, ".json": json.loads}
    loader = loaders.get(path.suffix.lower())
    if loader is None:
        raise ConfigError(f"config file {path}: expected a .toml or .json file")
    try:
        data = loader(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table of option names")
    return data


def _toml(raw: bytes) -> dict[str, Any]:
    return tomllib.loads(raw.decode("utf-8"))


def _flag_converter(opt: Option) -> Callable[[str], OptionValue]:
    def convert(text: str) -> OptionValue:
        try:
            return _parse_text(opt, text, None)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = opt.type.__name__
    return convert


def _parse_text(opt: Option, text: str, where: str | None) -> OptionValue:
    """Convert a flag or environment string; ``where`` prefixes the error (env var name)."""
    prefix = f"{where}: " if where else ""
    value: OptionValue
    try:
        value = _convert_text(opt.type, text)
    except ValueError:
        raise ConfigError(f"{prefix}expected {_TYPE_WORDS[opt.type]}, got {text!r}") from None
    return _check_choice(opt, value, prefix)


def _convert_text(kind: OptionType, text: str) -> OptionValue:
    if kind is bool:
        word = text.strip().lower()
        if word in _TRUE_WORDS | _FALSE_WORDS:
            return word in _TRUE_WORDS
        raise ValueError(text)
    if kind is int:
        return int(text.strip().replace("_", ""))
    if kind is float:
        return float(text)
    return text


def _check_type(opt: Option, value: object, where: str) -> OptionValue:
    """Validate a typed value (config file, default); ints are accepted for floats."""
    ok = isinstance(value, opt.type) and not (opt.type is not bool and isinstance(value, bool))
    if opt.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{where}: expected {_TYPE_WORDS[opt.type]}, got {value!r}")
    assert isinstance(value, int | float | str | bool)
    return _check_choice(opt, value, f"{where}: ")


def _check_choice(opt: Option, value: OptionValue, prefix: str) -> OptionValue:
    if opt.choices is not None and value not in opt.choices:
        allowed = ", ".join(str(choice) for choice in opt.choices)
        raise ConfigError(f"{prefix}expected one of {allowed}; got {value!r}")
    return value


def _help_text(opt: Option, service: str | None) -> str:
    parts = [opt.help]
    if opt.unit:
        parts.append(f"[unit: {opt.unit}]")
    default = "unset" if opt.default is None else _show(opt.default)
    extra = f"default: {default}"
    if service is not None:
        extra += f"; env: {opt.env_var(service)}"
    parts.append(f"({extra})")
    return " ".join(parts).replace("%", "%%")


def _metavar(opt: Option) -> str:
    if opt.choices:
        return "{" + ",".join(str(choice) for choice in opt.choices) + "}"
    if opt.name in ("listen", "metrics_listen"):
        return "HOST:PORT"
    if opt.name == "config" or opt.name.endswith(("_path", "_dir", "_file")):
        return "PATH"
    return opt.type.__name__.upper() if opt.type is not str else "TEXT"


def _show(value: OptionValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _env_part(service: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", service).upper()


# Every service gets these (defined last: Option validates with the helpers above).
COMMON_OPTIONS: tuple[Option, ...] = (
    Option("listen", str, "127.0.0.1:0", "gRPC endpoint HOST:PORT; port 0 picks a free port"),
    Option(
        "log_level", str, "info", "minimum log level", choices=("debug", "info", "warning", "error")
    ),
    Option("log_format", str, "text", "log line format on stderr", choices=("text", "json")),
    Option(
        "metrics_listen",
        str,
        None,
        "Prometheus scrape endpoint HOST:PORT (serves /metrics); unset means off; "
        "port 0 picks a free port (the ready file's metrics key names it)",
    ),
    Option(
        "otel_traces_exporter",
        str,
        "auto",
        "OpenTelemetry span exporter; auto means otlp when OTEL_EXPORTER_OTLP_ENDPOINT is "
        "set, none otherwise; file writes JSON lines to --otel-traces-file",
        choices=("auto", "none", "console", "file", "otlp"),
    ),
    Option(
        "otel_traces_file",
        str,
        None,
        "where the file span exporter appends JSON lines; {service} and {pid} are replaced",
    ),
    Option(
        "otel_traces_sampler_ratio",
        float,
        1.0,
        "fraction of new traces sampled (0..1); calls carrying a sampled parent follow it",
    ),
    Option(
        "otel_metrics_exporter",
        str,
        "auto",
        "OpenTelemetry metric exporter (pushing; see --metrics-listen for Prometheus); auto "
        "means otlp when OTEL_EXPORTER_OTLP_ENDPOINT is set, none otherwise",
        choices=("auto", "none", "console", "otlp"),
    ),
    Option("otel_service_name", str, None, "OpenTelemetry service.name; unset means tide-SERVICE"),
    Option(
        "event_loop",
        str,
        EVENT_LOOPS[0],
        "the asyncio event loop the service runs on: uvloop (libuv; less CPU a call) or "
        "asyncio (the standard library's); uvloop that cannot be imported falls back to "
        "asyncio with a warning",
        choices=EVENT_LOOPS,
    ),
    Option(
        "shutdown_grace_s",
        float,
        10.0,
        "on SIGTERM/SIGINT, how long in-flight calls may run before they are cancelled",
        unit="s",
    ),
    Option(
        "tls_cert_file",
        str,
        None,
        "PEM certificate chain: serve TLS (unset means plaintext) and, on the links to other "
        "Tide services, the client certificate; re-read when the file changes",
    ),
    Option("tls_key_file", str, None, "PEM private key of --tls-cert-file"),
    Option(
        "tls_ca_file",
        str,
        None,
        "PEM CA bundle that signed the cluster's certificates: verifies the services this one "
        "calls and, on storage/dispatch/name server, the client certificates (mutual TLS)",
    ),
    Option(
        "tls_reload_interval_ms",
        int,
        5_000,
        "how often, at most, the TLS files are checked for a new certificate (the port's"
        " new connections; the links to other services: the calls after a change)",
        unit="ms",
    ),
    Option(
        "cluster_secret_file",
        str,
        None,
        "a file holding the secret every service of the cluster shares (16..1024 printable "
        "characters): sent on the channels between services; storage, dispatch and name "
        "server refuse calls without it (health and reflection stay open); unset means off",
    ),
    Option("config", str, None, "a .toml or .json file whose keys are option names (snake_case)"),
)
