"""A ``grpc.aio.Channel`` standing in front of another: the base of the channels Tide
hands out in place of gRPC's own (tide/_tls_channels.py's ``ReloadingChannel``,
tide/server/_cluster_secret.py's ``SecretChannel``)."""

from __future__ import annotations

from typing import Self

import grpc


class ForwardingChannel(grpc.aio.Channel):
    """Forwards the channel's state, readiness and close to :meth:`current`; a subclass
    makes the multicallables (each its own way) and says which channel is current."""

    def current(self) -> grpc.aio.Channel:
        raise NotImplementedError

    async def close(self, grace: float | None = None) -> None:
        await self.current().close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.current().get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self.current().wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.current().channel_ready()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(None)
