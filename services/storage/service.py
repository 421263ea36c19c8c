"""The storage service: the engine behind ``tide.v1.Storage``."""

from __future__ import annotations

import asyncio
import logging
import sys

import grpc

from services.storage.engine.message_store import MessageStore
from services.storage.options import OPTIONS, advertised_host, store_config
from services.storage.servicer import StorageServicer
from tide.server import Config, load_config, run_service
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.storage")


class StorageService:
    name = "tide.v1.Storage"

    def __init__(self, config: Config) -> None:
        self._config = config
        self._store: MessageStore | None = None
        self._servicer = StorageServicer(
            self._store_or_fail, config.get_int("tail_max_chunk_bytes")
        )

    def _store_or_fail(self) -> MessageStore:
        store = self._store
        if store is None:
            raise RuntimeError("storage is not started")  # the readiness gate prevents this
        return store

    def add_to_server(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_StorageServicer_to_server(self._servicer, server)

    def drain(self) -> None:
        self._servicer.drain()

    async def start(self, endpoint: str) -> None:
        store = MessageStore(store_config(self._config, advertised_host(self._config, endpoint)))
        await asyncio.to_thread(store.open)  # recovery can take a while; health says so
        self._store = store

    async def stop(self) -> None:
        if self._store is not None:
            await asyncio.to_thread(self._store.close)


def main(argv: list[str] | None = None) -> None:
    config = load_config("storage", OPTIONS, sys.argv[1:] if argv is None else argv)
    run_service(StorageService(config), config)
