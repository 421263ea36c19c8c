"""The event loop a service runs on (``--event-loop``): uvloop by default, asyncio's own
on request or when uvloop cannot be imported.

Every Tide service is one asyncio program: grpc.aio hands each call's completions to the
loop (its poller thread wakes the loop, the loop runs a callback per completion), so the
loop's own machinery (handles, futures, the self-pipe, the selector) is part of every
message's cost. uvloop runs the same asyncio programs on libuv with that machinery
compiled; on the 2-core reference box each service of a cluster on uvloop took 0.89-0.95x
the CPU a message of the same service on asyncio's loop, both clusters up at once and
measured window by window (2-7 % of it the loop's own: docs/performance.md, "The
services' event loop"). Nothing in Tide depends on which loop runs: ``asyncio`` stays a
choice for an operator who wants the standard library's loop (debugging with
``PYTHONASYNCIODEBUG``, a platform without uvloop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("tide.server.event_loop")

UVLOOP = "uvloop"
ASYNCIO = "asyncio"
EVENT_LOOPS = (UVLOOP, ASYNCIO)
"""The choices of ``--event-loop``, the default first."""

LoopFactory = Callable[[], asyncio.AbstractEventLoop]
T = TypeVar("T")


def loop_factory(name: str) -> LoopFactory:
    """How to make the loop ``--event-loop name`` runs on. uvloop that cannot be imported
    falls back to asyncio's loop with one warning (the service still serves; it only
    costs more CPU a call)."""
    if name not in EVENT_LOOPS:
        raise ValueError(f"event loop {name!r} is unknown: one of {', '.join(EVENT_LOOPS)}")
    if name == UVLOOP:
        try:
            import uvloop
        except ImportError as exc:
            log.warning(
                "--event-loop uvloop: cannot import uvloop (%s); running on asyncio's loop", exc
            )
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def running_loop_name() -> str:
    """Which loop runs the calling coroutine: ``uvloop`` or ``asyncio`` (the ready file
    and the start-up log say it, so an operator sees what ``--event-loop`` gave)."""
    module = type(asyncio.get_running_loop()).__module__
    return UVLOOP if module.split(".", 1)[0] == UVLOOP else ASYNCIO


def run_on(name: str, main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop ``--event-loop name`` gives. No global policy
    changes: a thread or a library that makes its own loop gets asyncio's, as usual."""
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(main)
