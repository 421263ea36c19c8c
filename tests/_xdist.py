"""How the suite is spread over pytest-xdist workers (``make test``: ``-n 2 --dist
loadgroup``; tests/conftest.py installs this).

A work unit goes to one worker as a whole, and a worker asks for the next unit when it runs
out. The units:

* a test module, by default: its module-scoped fixtures (a cluster of real processes,
  mostly) then start once, on one worker, as in a serial run;
* one directory, for those whose tests share a session- or package-scoped fixture that is
  costly to start twice (``SHARED_DIRS``): the Spark session and its cluster, the console's
  cluster and browser;
* an ``xdist_group`` mark still names a unit of its own (xdist's ``loadgroup`` meaning).

Units go out in collection order, and :func:`longest_first` puts the units that take
longest first (``LONGEST_UNITS``, from the suite's measured durations): with the long ones
started early, neither worker is left running one alone at the end.
"""

from __future__ import annotations

from typing import Any

import pytest

# Directories whose tests share one costly session- or package-scoped fixture.
SHARED_DIRS = (
    "tests/spark/",  # a Spark session (a JVM, ~18 s to start, 1 GiB) and a cluster
    "tests/services/console/",  # a cluster, a console and Chromium (package scope)
)
# The longest units, longest first: per-unit sums of the per-test times (junit XML) of a
# `-n 2` run on 2026-11-27 at load 2-6 (2 cores; 11:42 wall): tests/spark 212 s, the
# console 79 s, then 45 s down to 20 s. Every other unit is under 20 s.
LONGEST_UNITS: tuple[str, ...] = (
    "tests/spark/",
    "tests/services/console/",
    "tests/services/gateway/v2/test_official_consumers.py",
    "tests/services/dispatch/delivery/test_timer_service.py",
    "tests/services/dispatch/test_crash.py",
    "tests/cli/test_bench.py",
    "tests/cli/test_gateway_commands.py",
    "tests/test_ha_cluster.py",
    "tests/cli/test_up.py",
    "tests/services/gateway/test_held_pulls.py",
    "tests/deploy/test_image.py",
    "tests/services/storage/test_crash.py",
    "tests/cli/test_store_cli.py",
    "tests/test_delivery_crash_cluster.py",
    "tests/services/storage/test_registration.py",
    "tests/test_pop_crash_cluster.py",
)


def work_unit(nodeid: str) -> str:
    """The unit of the test ``nodeid`` (``path::name[params]``, maybe ``@group``)."""
    at = nodeid.rfind("@")
    if at > nodeid.rfind("]"):  # an xdist_group mark (loadgroup adds "@name")
        return nodeid[at + 1 :]
    path = nodeid.split("::", 1)[0]
    for shared in SHARED_DIRS:
        if path.startswith(shared):
            return shared
    return path


def _rank(nodeid: str) -> int:
    unit = work_unit(nodeid)
    for rank, longest in enumerate(LONGEST_UNITS):
        if unit == longest:
            return rank
    return len(LONGEST_UNITS)


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the longest units first, otherwise collection order
    (a stable sort: each module's tests stay together and in order)."""
    items.sort(key=lambda item: _rank(item.nodeid))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's LoadScopeScheduling with :func:`work_unit` as its scope, in collection
    order (its default reorder by the count of tests per unit would undo
    :func:`longest_first`)."""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class TideScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return TideScheduling(config, log)
