"""The cluster page in a real browser: the broker the cluster runs, its role and
addresses, and the n/a figures the gateway's API does not carry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from tests._cluster import Cluster
from tests.services.console.conftest import ConsoleProcess


def test_cluster_page_lists_the_brokers(
    page: Page,
    console: ConsoleProcess,
    console_cluster: Cluster,
    shot: Callable[[Page, str], Path],
) -> None:
    page.goto(f"{console.url}/cluster")
    expect(page.get_by_role("heading", level=1)).to_have_text("Cluster")
    broker = console_cluster.brokers[0]
    row = page.get_by_role("row").filter(has_text=broker.storage_address)
    expect(row).to_contain_text("broker-a")
    expect(row).to_contain_text("master")
    expect(row).to_contain_text(broker.dispatch_address)
    expect(page.get_by_role("link", name="Cluster")).to_have_attribute("aria-current", "page")
    shot(page, "cluster")


def test_healthz_answers_ok(page: Page, console: ConsoleProcess) -> None:
    response = page.goto(f"{console.url}/healthz")
    assert response is not None and response.status == 200
    expect(page.locator("body")).to_have_text("ok")
