"""Services import ``tide``, never each other; ``tide`` never imports ``services``.

A service runs as its own process: code two of them share lives in ``tide/``. The source
is scanned with ast (every ``import`` and ``from ... import``, at any depth, also inside
functions and ``if TYPE_CHECKING:``), so a violation fails here before anything runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = ROOT / "services"
TIDE_DIR = ROOT / "tide"
SERVICE_NAMES = sorted(
    path.name for path in SERVICES_DIR.iterdir() if (path / "__init__.py").is_file()
)


def imported_modules(source: str, package: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in ``source``, a module of ``package``; a relative
    import is resolved against the package, so ``from ..nameserver import x`` counts."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            # ``from services import gateway`` imports services.gateway
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def source_violations(
    source: str, package: tuple[str, ...], allowed_service: str | None
) -> list[tuple[int, str]]:
    """(line, module) of each import of ``services`` in ``source`` (but ``services`` itself
    and ``services.<allowed_service>...``)."""
    found = []
    for line, module in imported_modules(source, package):
        parts = module.split(".")
        if parts[0] != "services":
            continue
        if allowed_service is not None and (len(parts) == 1 or parts[1] == allowed_service):
            continue
        found.append((line, module))
    return found


def violations(files: Iterator[Path], allowed_service: str | None) -> list[str]:
    found = []
    for path in files:
        package = path.relative_to(ROOT).with_suffix("").parts[:-1]
        for line, module in source_violations(path.read_text(), package, allowed_service):
            found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_a_service_imports_no_other_service(service: str) -> None:
    found = violations((SERVICES_DIR / service).rglob("*.py"), service)
    assert not found, "move what is shared to tide/:\n" + "\n".join(found)


def test_tide_never_imports_services() -> None:
    found = violations(TIDE_DIR.rglob("*.py"), None)
    assert not found, "tide/ must not import services (start them as processes):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "source",
    [
        "import services.nameserver.options\n",
        "from services.gateway import options\n",
        "from services import dispatch\n",
        "def f() -> None:\n    from ..nameserver import route_info\n",
        "if TYPE_CHECKING:\n    from services.dispatch.options import OPTIONS\n",
    ],
)
def test_the_scan_catches_each_form_of_a_cross_service_import(source: str) -> None:
    assert source_violations(source, ("services", "storage"), "storage")
    if "from .." not in source:  # (relative to tide.cli it is tide.nameserver)
        assert source_violations(source, ("tide", "cli"), None)


def test_the_scan_allows_a_service_its_own_package() -> None:
    source = "from services.storage import options\nfrom . import servicer\nimport tide\n"
    assert not source_violations(source, ("services", "storage"), "storage")
    assert SERVICE_NAMES == ["dispatch", "gateway", "nameserver", "storage"]
