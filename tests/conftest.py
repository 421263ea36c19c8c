"""The whole suite's hooks: how ``make test`` spreads it over pytest-xdist workers
(tests/_xdist.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests import _xdist


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _xdist.longest_first(items)


# optionalhook: the hook exists only with xdist loaded (`-p no:xdist` runs without it);
# tryfirst: before xdist's own, which would answer first otherwise.
@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None  # any other --dist mode: xdist's own
    return _xdist.make_scheduler(config, log)
