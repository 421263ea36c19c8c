"""Stopping background tasks: the services' ``stop()`` methods share this."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel every task (None: none was started), then wait for each to end, so nothing
    it holds is closed under it. Its CancelledError is the expected end; another error
    it ends with is raised."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    for task in started:
        with contextlib.suppress(asyncio.CancelledError):
            await task
