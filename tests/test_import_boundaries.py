"""The layering contracts themselves are checked by import-linter (`lint-imports` in
`make test`, contracts in pyproject.toml's ``[tool.importlinter]``). What it cannot know:
that they name every service and every engine. A new service or engine package left out
of its contract would not be checked at all; this fails instead."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = ROOT / "services"


def contract(kind: str) -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (found,) = [c for c in config["contracts"] if c["type"] == kind and _applies(c, kind)]
    return dict(found)


def _applies(candidate: dict[str, Any], kind: str) -> bool:
    if kind == "independence":
        return True
    return "grpc" in candidate["forbidden_modules"]


def test_every_service_is_independent_of_the_others() -> None:
    services = sorted(
        f"services.{p.name}" for p in SERVICES_DIR.iterdir() if (p / "__init__.py").is_file()
    )
    assert sorted(contract("independence")["modules"]) == services


def test_every_engine_is_kept_off_the_wire() -> None:
    engines = sorted(
        f"services.{p.parent.parent.name}.engine" for p in SERVICES_DIR.glob("*/engine/__init__.py")
    )
    assert sorted(contract("forbidden")["source_modules"]) == engines
