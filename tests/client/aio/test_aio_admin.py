"""tide.client.aio's Admin against a real cluster (mirrors tests/client/test_admin_groups.py
and the Admin parts of test_produce_pull.py), and the asyncio client over TLS to a
gateway with authentication on (its own small cluster, as tests/security/test_tls.py and
tests/auth make theirs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN, REFRESH_MS, init_user_file
from tide.certs import make_ca, make_leaf
from tide.client import Admin as SyncAdmin
from tide.client import (
    InvalidArgument,
    MessageQueue,
    NotFound,
    PermissionDenied,
    PolicyEntry,
    TlsFiles,
    TopicNotFound,
    Unauthenticated,
)
from tide.client.aio import Admin, Producer, PullConsumer
from tide.waiting import wait_until, wait_until_async


def test_topics_groups_cluster_and_queries(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen

    async def run() -> None:
        async with Admin(gateway) as admin:
            brokers = await admin.create_topic(
                "T_aio_admin", read_queue_nums=2, broker_names=["broker-a"]
            )
            assert brokers == ["broker-a"]
            assert "T_aio_admin" in await admin.list_topics()
            route = await admin.route("T_aio_admin")
            assert [d.broker_name for d in route.queue_datas] == ["broker-a"]
            info = await admin.cluster()
            assert {"broker-a", "broker-b"} <= {b.broker_name for b in info.brokers}
            await admin.create_group("G_aio_admin", retry_max_times=5)
            assert (await admin.get_group("G_aio_admin")).group.retry_max_times == 5
            await admin.update_group("G_aio_admin", retry_max_times=7)
            groups = {g.group_name: g for g in await admin.list_groups()}
            assert groups["G_aio_admin"].retry_max_times == 7
            assert await admin.consumers("G_aio_admin") == []
            async with Producer(gateway) as producer:
                sent = await producer.send("T_aio_admin", b"find me", keys=["needle"])
            found = await admin.query_id(sent.msg_id)
            assert found.body == b"find me"

            async def browsed() -> bool:  # once dispatch has built the consume queue
                found = await admin.browse_queue(sent.queue, 0)
                return [m.msg_id for m in found.messages] == [sent.msg_id]

            await wait_until_async(browsed, "the message browsed in its queue")
            # The sync Admin's errors, raised here.
            with pytest.raises(InvalidArgument, match="read_queue_nums"):
                await admin.create_topic("T_aio_admin_bad", read_queue_nums=0)
            with pytest.raises(TopicNotFound):
                await admin.route("T_aio_admin_missing")
            with pytest.raises(NotFound):
                await admin.query_id("7F00000100002A9F0000000000000000")
            assert await admin.delete_group("G_aio_admin")
            assert await admin.delete_topic("T_aio_admin")
        await admin.close()  # idempotent

    asyncio.run(run())


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, TlsFiles]]:
    root = tmp_path_factory.mktemp("aio-secure")
    ca = make_ca(root / "certs", "aio-ca")
    leaf = make_leaf(ca, root / "certs", "service")
    files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
    with Cluster(
        root,
        brokers=1,
        tls=files,
        storage_args=["--auth-init-user-file", str(init_user_file(root))],
        gateway_args=["--auth-enabled", "--auth-refresh-interval-ms", str(REFRESH_MS)],
    ) as cluster:
        gateway_ca = TlsFiles(ca_file=files.ca_file)
        with SyncAdmin(cluster.gateway.listen, tls=gateway_ca, credentials=ADMIN) as admin:
            wait_until(lambda: _known(admin), "the gateway knowing the first user")
        yield cluster, gateway_ca


def _known(admin: SyncAdmin) -> bool:
    """The gateway loads its users after it starts (and every REFRESH_MS)."""
    try:
        admin.list_users()
    except Unauthenticated:
        return False
    return True


def test_tls_and_signed_calls(
    secure_cluster: tuple[Cluster, TlsFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, tls = secure_cluster
    gateway = cluster.gateway.listen

    async def run() -> None:
        async with Admin(gateway, tls=tls, credentials=ADMIN) as admin:
            await admin.create_topic("T_aio_secure", read_queue_nums=1)
            await admin.create_user("aio-reader", "aio-reader-secret-0123")
            await admin.create_acl(
                "aio-reader", [PolicyEntry("Topic:T_aio_secure", ["Sub"], "Allow", [])]
            )
        # Producer and consumers sign with TIDE_ACCESS_KEY / TIDE_SECRET_KEY, as the sync ones.
        monkeypatch.setenv("TIDE_ACCESS_KEY", ADMIN.access_key)
        monkeypatch.setenv("TIDE_SECRET_KEY", ADMIN.secret_key)
        async with Producer(gateway, tls=tls) as producer:
            sent = await producer.send("T_aio_secure", b"secret")
        async with PullConsumer("G_aio_secure", gateway, tls=tls) as consumer:
            queue = MessageQueue("T_aio_secure", sent.queue.broker_name, 0)
            assert (await consumer.offsets(queue)).max_offset >= 0
        monkeypatch.delenv("TIDE_ACCESS_KEY")
        monkeypatch.delenv("TIDE_SECRET_KEY")
        async with Producer(gateway, tls=tls) as unsigned:
            with pytest.raises(Unauthenticated):
                await unsigned.send("T_aio_secure", b"x")
        # credentials= signs without the environment, as on the sync clients.
        async with Producer(gateway, tls=tls, credentials=ADMIN) as given:
            assert (await given.send("T_aio_secure", b"given")).written
        async with PullConsumer("G_aio_secure", gateway, tls=tls, credentials=ADMIN) as consumer:
            assert (await consumer.offsets(queue)).max_offset >= 1
        monkeypatch.setenv("TIDE_ACCESS_KEY", "aio-reader")
        monkeypatch.setenv("TIDE_SECRET_KEY", "aio-reader-secret-0123")
        async with Producer(gateway, tls=tls) as reader:

            async def refused_by_acl() -> bool:
                """Unauthenticated until the gateway loaded the new user (REFRESH_MS)."""
                try:
                    await reader.send("T_aio_secure", b"not allowed")
                except Unauthenticated:
                    return False
                except PermissionDenied:
                    return True
                raise AssertionError("a Sub-only user produced")

            await wait_until_async(refused_by_acl, "the reader's send refused by its ACL")

    asyncio.run(run())
