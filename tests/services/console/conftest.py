"""The console's browser tests: ONE real cluster for the package (tests/_cluster.py), the
console as a real process (``python -m services.console``) against its gateway, and a
Playwright page driving Debian's Chromium (/usr/bin/chromium; ``make test`` installs it).

Fixtures: ``console_cluster`` (the cluster), ``console`` (a :class:`ConsoleProcess`:
``url``, ``gateway``), ``page`` (a fresh browser context and page per test: no cookie
shared between tests) and ``shot(page, name)`` (a screenshot to
``test-artifacts/console/<name>.png``, kept as a test artifact).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests._cluster import Cluster
from tests._service_process import REPO_ROOT, spawn
from tide.spawn import stop, wait_ready

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
ARTIFACTS = REPO_ROOT / "test-artifacts" / "console"
# Playwright's auto-waiting bound for each expect / action (a page under a loaded machine).
EXPECT_TIMEOUT_MS = 20_000
CONSOLE_READY_TIMEOUT_S = 30.0
expect.set_options(timeout=EXPECT_TIMEOUT_MS)


@dataclass
class ConsoleProcess:
    url: str  # "http://127.0.0.1:PORT" (no trailing slash)
    gateway: str
    workdir: Path

    def stderr(self) -> str:
        return (self.workdir / "stderr.log").read_text(errors="replace")


def start_console(
    workdir: Path, gateway: str, extra: Sequence[str] = ()
) -> Iterator[ConsoleProcess]:
    """Run a console against ``gateway`` until the generator is closed."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = (
        sys.executable,
        "-m",
        "services.console",
        "--listen",
        "127.0.0.1:0",
        "--gateway",
        gateway,
        *extra,
    )
    proc = spawn(command, workdir)
    try:
        ready = wait_ready(
            proc,
            workdir / "ready.json",
            "console",
            CONSOLE_READY_TIMEOUT_S,
            stderr_path=workdir / "stderr.log",
        )
        yield ConsoleProcess(f"http://{ready['listen']}", gateway, workdir)
    finally:
        stop(proc)


@pytest.fixture(scope="package")
def console_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The storage serves Prometheus metrics: the cluster page reads its figures there.
    with Cluster(
        tmp_path_factory.mktemp("console-cluster"),
        brokers=1,
        storage_args=["--metrics-listen", "127.0.0.1:0"],
    ) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def console(
    console_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleProcess]:
    gateway_metrics = str(console_cluster.gateway.ready["metrics"])
    storage_metrics = str(console_cluster.brokers[0].storage.ready["metrics"])
    yield from start_console(
        tmp_path_factory.mktemp("console"),
        console_cluster.gateway.listen,
        (
            "--metrics-endpoint",
            f"gateway={gateway_metrics}",
            "--metrics-endpoint",
            f"broker-a={storage_metrics}",
        ),
    )


@pytest.fixture(scope="package")
def playwright_driver() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as driver:
        driver.selectors.set_test_id_attribute("data-testid")
        yield driver


@pytest.fixture(scope="package")
def browser(playwright_driver: Playwright) -> Iterator[Browser]:
    # Playwright gives each launch a fresh temporary user-data-dir.
    chromium = playwright_driver.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=list(CHROMIUM_ARGS)
    )
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(EXPECT_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def save_screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def shot() -> Callable[[Page, str], Path]:
    return save_screenshot
