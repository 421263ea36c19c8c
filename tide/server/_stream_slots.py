"""A bound on the open streams of one method. Each open stream holds at most a message
or two (its handler reads one request, or writes one chunk, at a time), so bounding
their number bounds their memory: streams x the method's per-message byte cap."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc

from tide.server._interceptor import ServiceError


class StreamSlots:
    """At most ``limit`` streams of ``method`` open at once; the next is refused
    RESOURCE_EXHAUSTED naming the limit (``constant``, where it is set)."""

    def __init__(self, method: str, limit: int, constant: str) -> None:
        self.method = method
        self.limit = limit
        self.constant = constant
        self.open = 0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the stream's lifetime (raises when none is free)."""
        if self.open >= self.limit:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.limit} {self.method} streams are open on this service, the limit "
                f"({self.constant}): close idle ones or retry later",
            )
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
