"""The delivery services' shared role watcher and progress copy (delivery/role.py,
delivery/progress.py's ProgressCopy), against real storage processes."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from services.dispatch.delivery.progress import ProgressCopy
from services.dispatch.delivery.role import RoleWatcher
from services.dispatch.storage_client import StorageClient
from tests._service_process import free_port
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.storage.conftest import StorageLauncher
from tide.format import DataVersion, DelayOffsets, encode_delay_offsets
from tide.waiting import wait_until_async

Launchers = tuple[StorageLauncher, DispatchLauncher]
ROLE_INTERVAL_S = 0.05
LOGGER = "tide.dispatch.delivery"


def offsets_json(level_1_offset: int) -> bytes:
    document = encode_delay_offsets(DelayOffsets({1: level_1_offset}, DataVersion(0, 1, 1)))
    return json.dumps(document).encode()


def messages(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if fragment in r.getMessage()]


def test_a_copy_fails_logged_once_per_outage_and_passes_again(
    launchers: Launchers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    launcher = launchers[0]
    listen = ("--listen", f"127.0.0.1:{free_port()}")
    storage = launcher.start(tmp_path / "store", *listen)
    kept = tmp_path / "store" / "config" / "delayOffset.json"

    async def run() -> list[bool]:
        client = StorageClient(storage.listen)
        role = RoleWatcher(client, ROLE_INTERVAL_S)
        role.start()
        copier = ProgressCopy(client, role, "delay level progress")
        try:
            await wait_until_async(lambda: role.active, "the watcher to see a master")
            taken = [await copier.copy(delay_offsets_json=offsets_json(1))]
            await asyncio.to_thread(storage.kill)
            # The watcher keeps its last answer while the storage does not answer.
            for offset in (2, 3):
                taken.append(await copier.copy(delay_offsets_json=offsets_json(offset)))
            assert role.active
            await asyncio.to_thread(launcher.start, tmp_path / "store", *listen)
            # Each save copies again: the first ones may still find the channel waiting
            # to reconnect (still the same outage, so nothing more is logged).
            await wait_until_async(
                lambda: copier.copy(delay_offsets_json=offsets_json(4)),
                "a copy to pass once the storage is back",
            )
            return taken
        finally:
            await role.stop()
            await client.close()

    assert asyncio.run(run()) == [True, False, False]
    assert json.loads(kept.read_text())["offsetTable"] == {"1": 4}
    assert len(messages(caplog, "cannot copy the delay level progress")) == 1
    assert len(messages(caplog, "delay level progress copied to storage")) == 1


def test_beside_a_slave_nothing_is_active_and_nothing_copied(
    launchers: Launchers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    launcher = launchers[0]
    master = launcher.start(tmp_path / "master")
    slave = launcher.start(
        tmp_path / "slave", "--role", "SLAVE", "--broker-id", "1", "--master", master.listen
    )

    async def run() -> bool:
        client = StorageClient(slave.listen)
        role = RoleWatcher(client, ROLE_INTERVAL_S)
        role.start()
        try:
            await wait_until_async(lambda: client.last_status is not None, "the role asked")
            assert not role.active
            waiting = asyncio.create_task(role.wait_active())
            await asyncio.sleep(0)
            assert not waiting.done()  # held while the storage is a slave
            waiting.cancel()
            copier = ProgressCopy(client, role, "timer checkpoint")
            return await copier.copy(timer_checkpoint=b"\0" * 56)
        finally:
            await role.stop()
            await client.close()

    assert asyncio.run(run()) is False
    assert not messages(caplog, "cannot copy")  # not even tried: a slave refuses it
    assert not (tmp_path / "slave" / "config" / "timercheck").exists()


def test_refresh_asks_now_without_waiting_an_interval(launchers: Launchers, tmp_path: Path) -> None:
    """EndTransaction's case: a watcher that has not asked yet (or asked a storage that was
    a slave) answers from a fresh GetStatus, and the answer is kept."""
    launcher = launchers[0]
    master = launcher.start(tmp_path / "master")
    slave = launcher.start(
        tmp_path / "slave", "--role", "SLAVE", "--broker-id", "1", "--master", master.listen
    )

    async def run() -> list[bool]:
        answers = []
        for storage in (master, slave):
            client = StorageClient(storage.listen)
            role = RoleWatcher(client, 3600.0)  # never started: only refresh() asks
            try:
                before = role.active
                answers += [before, await role.refresh(), role.active]
            finally:
                await client.close()
        return answers

    assert asyncio.run(run()) == [False, True, True, False, False, False]
