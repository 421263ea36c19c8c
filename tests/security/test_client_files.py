"""The internal links' client credentials follow their files (tide/_tls_channels.py):
a new generation once a file changed and loads; none while a file is missing or
unreadable; a ReloadingChannel opens a new channel for the calls after a change."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from tide._tls_channels import ClientFiles, ReloadingChannel
from tide.certs import make_ca, make_leaf
from tide.tls import TlsError, TlsFiles, channel_credentials
from tide.waiting import wait_until

INTERVAL_MS = 10


def _files(root: Path) -> TlsFiles:
    leaf = make_leaf(make_ca(root), root, "service")
    return TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))


def _watch(files: TlsFiles) -> ClientFiles:
    paths = [p for p in (files.cert_file, files.key_file, files.ca_file) if p]
    return ClientFiles(paths, lambda: channel_credentials(files), reload_interval_ms=INTERVAL_MS)


def test_a_changed_file_is_a_new_generation(tmp_path: Path) -> None:
    files = _files(tmp_path)
    watched = _watch(files)
    generation, credentials = watched.current()
    assert generation == 0
    make_leaf(make_ca(tmp_path / "new"), tmp_path, "service")  # the same paths, new files
    wait_until(lambda: watched.current()[0] == 1, "the change seen")
    assert watched.current()[1] is not credentials


def test_a_file_that_fails_to_load_keeps_the_current_credentials(tmp_path: Path) -> None:
    files = _files(tmp_path)
    assert files.key_file is not None
    watched = _watch(files)
    tried: list[str] = []

    def failing() -> grpc.ChannelCredentials:
        tried.append("load")
        raise TlsError("--tls-key-file: cannot read it")

    watched._build = failing  # the next load fails: the links keep what they have
    key = Path(files.key_file)
    key.write_bytes(key.read_bytes() + b"\n")

    def tried_once() -> bool:
        watched.current()
        return bool(tried)

    wait_until(tried_once, "a reload tried")
    assert watched.current()[0] == 0


def test_a_missing_file_is_not_a_change(tmp_path: Path) -> None:
    files = _files(tmp_path)
    assert files.key_file is not None
    watched = _watch(files)
    os.rename(files.key_file, f"{files.key_file}.away")  # caught mid-replacement
    stamps = watched._stamps()
    assert (-1, -1) in stamps
    watched._next_check = 0.0  # check now
    assert watched.current()[0] == 0


def test_a_reloading_channel_reopens_after_a_change(tmp_path: Path) -> None:
    files = _files(tmp_path)
    watched = _watch(files)
    opened: list[grpc.aio.Channel] = []

    def open_channel(credentials: grpc.ChannelCredentials) -> grpc.aio.Channel:
        opened.append(grpc.aio.secure_channel("127.0.0.1:1", credentials))
        return opened[-1]

    async def scenario() -> None:
        channel = ReloadingChannel(watched, open_channel)
        first = channel.current()
        assert channel.current() is first and len(opened) == 1
        make_leaf(make_ca(tmp_path / "new"), tmp_path, "service")
        wait_until(lambda: channel.current() is not first, "a new channel after the change")
        assert len(opened) == 2
        await channel.close()

    asyncio.run(scenario())
