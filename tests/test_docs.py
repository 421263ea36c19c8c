"""The docs name every option each service has, with its unit."""

from __future__ import annotations

from pathlib import Path

from services.dispatch.options import OPTIONS as DISPATCH_OPTIONS
from services.gateway.options import OPTIONS as GATEWAY_OPTIONS
from services.nameserver.options import OPTIONS as NAMESERVER_OPTIONS
from services.storage.options import OPTIONS as STORAGE_OPTIONS
from tide.server import Option
from tide.server._config import merge_options

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DOC = ROOT / "docs" / "configuration.md"


def reference_rows(service: str, options: tuple[Option, ...]) -> list[str]:
    """The table rows docs/configuration.md should hold (printed when one is missing)."""
    rows = []
    for opt in merge_options(options):
        default: object = opt.default
        if isinstance(default, bool):
            default = "on" if default else "off"
        if default is None:
            default = "(unset)"
        choices = f" One of: {', '.join(map(str, opt.choices))}." if opt.choices else ""
        rows.append(
            f"| `{opt.flag}` | {opt.unit or ''} | `{default}` | `{opt.env_var(service)}` | "
            f"{opt.help}.{choices} |"
        )
    return rows


def test_configuration_reference_lists_every_storage_option() -> None:
    text = CONFIG_DOC.read_text()
    missing = [row for row in reference_rows("storage", STORAGE_OPTIONS) if row not in text]
    assert not missing, "docs/configuration.md is out of date; rows to add:\n" + "\n".join(missing)


def test_configuration_reference_lists_every_dispatch_option() -> None:
    text = CONFIG_DOC.read_text()
    missing = [row for row in reference_rows("dispatch", DISPATCH_OPTIONS) if row not in text]
    assert not missing, "docs/configuration.md is out of date; rows to add:\n" + "\n".join(missing)


def test_configuration_reference_lists_every_nameserver_option() -> None:
    text = CONFIG_DOC.read_text()
    missing = [row for row in reference_rows("nameserver", NAMESERVER_OPTIONS) if row not in text]
    assert not missing, "docs/configuration.md is out of date; rows to add:\n" + "\n".join(missing)


def test_configuration_reference_lists_every_gateway_option() -> None:
    text = CONFIG_DOC.read_text()
    missing = [row for row in reference_rows("gateway", GATEWAY_OPTIONS) if row not in text]
    assert not missing, "docs/configuration.md is out of date; rows to add:\n" + "\n".join(missing)
