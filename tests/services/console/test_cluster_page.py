"""The cluster page in a real browser: the broker the cluster runs, its role, addresses and
storage figures (GetClusterInfo with_status through a real gateway), and the services at
the metrics endpoints."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from services.console.pages.cluster import Figures, figures_of
from services.gateway.cluster_status import storage_figures
from tests._cluster import Cluster
from tests.services.console.conftest import ConsoleProcess
from tide.client import Admin
from tide.format import DEFAULT_DELAY_LEVEL_TABLE
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb


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
    # The storage's status through the gateway (GetClusterInfo with_status).
    expect(page.get_by_test_id("writable-broker-a-0")).to_have_text("yes")
    expect(page.get_by_test_id("disk-broker-a-0")).to_have_text(re.compile(r"^[0-9.]+ %$"))
    expect(page.get_by_test_id("lag-broker-a-0")).to_have_text("n/a")  # no slave
    # The services that answer at the metrics endpoints the console was given.
    services = page.get_by_role("table").nth(1)
    expect(services.get_by_role("row").filter(has_text="tide-storage")).to_contain_text("answers")
    expect(services.get_by_role("row").filter(has_text="tide-gateway")).to_have_count(2)
    shot(page, "cluster")


def test_cluster_info_with_status_through_a_real_gateway(console_cluster: Cluster) -> None:
    with Admin(console_cluster.gateway.listen) as admin:
        plain = admin.cluster()
        (member,) = admin.cluster(with_status=True).brokers
    assert not plain.brokers[0].status_known and not plain.brokers[0].delay_levels_ms
    assert member.status_known and member.writable and member.status_error == ""
    assert 0 < member.disk_usage_ratio < 1
    assert (member.replicas, member.replication_lag_bytes) == (0, 0)
    assert tuple(member.delay_levels_ms) == DEFAULT_DELAY_LEVEL_TABLE.delays_ms
    figures = figures_of(member)
    assert figures.writable and figures.replication_lag_bytes is None
    assert figures.note == "no slave connected"


def test_replication_lag_is_a_slave_s_own_or_a_master_s_slowest_slave() -> None:
    replication = storage_pb.ReplicationStatus(
        slaves=[storage_pb.SlaveStatus(lag_bytes=10), storage_pb.SlaveStatus(lag_bytes=4096)]
    )
    master = ns_pb.BrokerLiveInfo(broker_id=0)
    storage_figures(
        master,
        storage_pb.StorageStatus(disk_usage_ratio=0.25, writable=False, replication=replication),
    )
    figures = figures_of(master)
    assert (figures.disk_usage_ratio, figures.writable) == (0.25, False)
    assert figures.replication_lag_bytes == 4096
    slave = ns_pb.BrokerLiveInfo(broker_id=1)
    storage_figures(
        slave,
        storage_pb.StorageStatus(
            replication=storage_pb.ReplicationStatus(master_connected=True, lag_bytes=7)
        ),
    )
    assert figures_of(slave).replication_lag_bytes == 7
    gone = ns_pb.BrokerLiveInfo(status_error="storage '1.2.3.4:5' GetStatus: UNAVAILABLE")
    assert figures_of(gone) == Figures(note=gone.status_error)


def test_healthz_answers_ok(page: Page, console: ConsoleProcess) -> None:
    response = page.goto(f"{console.url}/healthz")
    assert response is not None and response.status == 200
    expect(page.locator("body")).to_have_text("ok")
