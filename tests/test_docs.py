"""The docs name every option each service has, with its unit."""

from __future__ import annotations

import re
from pathlib import Path

from services.dispatch.options import OPTIONS as DISPATCH_OPTIONS
from services.gateway.options import OPTIONS as GATEWAY_OPTIONS
from services.nameserver.options import OPTIONS as NAMESERVER_OPTIONS
from services.storage.options import OPTIONS as STORAGE_OPTIONS
from tide.limits import BY_OPTION, FIELD_LIMITS, LIMITS
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


OPERATIONS_DOC = ROOT / "docs" / "operations.md"


def limits_section() -> str:
    text = OPERATIONS_DOC.read_text()
    start = text.index("\n## Limits\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_limits_table_lists_every_limit_with_its_value() -> None:
    """docs/operations.md "Limits" has a row per tide.limits constant, with its value."""
    section = limits_section()
    missing = [
        f"| `{name}` | {value} |"
        for name, value in LIMITS.items()
        if f"| `{name}` | {value} |" not in section
    ]
    assert not missing, "docs/operations.md Limits is out of date; rows starting:\n" + "\n".join(
        missing
    )


def test_limits_table_names_only_known_limits() -> None:
    """A row naming a tide.limits-style constant names one that exists (a renamed or
    removed limit leaves no stale row)."""
    named = re.findall(r"^\| `([A-Z][A-Z_]+)` \|", limits_section(), flags=re.MULTILINE)
    assert named, "no limit rows found"
    assert sorted(set(named) - set(LIMITS)) == []


def test_every_field_limit_names_a_documented_limit() -> None:
    """Every request field's bound (tide.limits.FIELD_LIMITS) is a named, documented limit."""
    section = limits_section()
    for field, name in FIELD_LIMITS.items():
        assert name == BY_OPTION or f"| `{name}` |" in section, (field, name)
