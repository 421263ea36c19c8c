"""The cluster page in a real browser: the broker the cluster runs, its role and
addresses, and the n/a figures the gateway's API does not carry."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from services.console.metrics import Sample
from services.console.pages.cluster import figures_of
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
    # From the storage's Prometheus endpoint (--metrics-endpoint broker-a=...).
    expect(page.get_by_test_id("writable-broker-a-0")).to_have_text("yes")
    expect(page.get_by_test_id("disk-broker-a-0")).to_have_text(re.compile(r"^[0-9.]+ %$"))
    expect(page.get_by_test_id("lag-broker-a-0")).to_have_text("n/a")  # no slave
    # The services that answer at the metrics endpoints the console was given.
    services = page.get_by_role("table").nth(1)
    expect(services.get_by_role("row").filter(has_text="tide-storage")).to_contain_text("answers")
    expect(services.get_by_role("row").filter(has_text="tide-gateway")).to_have_count(2)
    shot(page, "cluster")


def test_replication_lag_is_a_slave_s_own_or_a_master_s_slowest_slave() -> None:
    master = {
        "tide_storage_disk_usage_ratio": [Sample({}, 0.25)],
        "tide_storage_writable": [Sample({}, 0.0)],
        "tide_storage_replication_lag_bytes": [
            Sample({"role": "master", "slave_id": "1"}, 10.0),
            Sample({"role": "master", "slave_id": "2"}, 4096.0),
        ],
    }
    figures = figures_of(master, slave=False)
    assert (figures.disk_usage_ratio, figures.writable) == (0.25, False)
    assert figures.replication_lag_bytes == 4096
    slave = {"tide_storage_replication_lag_bytes": [Sample({"role": "slave"}, 7.0)]}
    assert figures_of(slave, slave=True).replication_lag_bytes == 7
    assert figures_of({}, slave=False).note == "no slave connected"


def test_healthz_answers_ok(page: Page, console: ConsoleProcess) -> None:
    response = page.goto(f"{console.url}/healthz")
    assert response is not None and response.status == 200
    expect(page.locator("body")).to_have_text("ok")
