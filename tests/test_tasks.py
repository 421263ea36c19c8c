"""tide.tasks: the services' way to stop their background tasks."""

from __future__ import annotations

import asyncio

import pytest

from tide.tasks import cancel_and_wait


def test_every_task_is_cancelled_and_has_ended_on_return() -> None:
    cleaned: list[str] = []

    async def worker(name: str) -> None:
        try:
            await asyncio.Event().wait()  # never set: only a cancel ends it
        finally:
            await asyncio.sleep(0)  # a clean-up that awaits still runs to its end
            cleaned.append(name)

    async def main() -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(worker(name)) for name in ("a", "b")]
        await asyncio.sleep(0)  # both started
        await cancel_and_wait(tasks[0], None, tasks[1])  # None: a task never started
        return tasks

    tasks = asyncio.run(main())
    assert all(task.cancelled() for task in tasks)
    assert sorted(cleaned) == ["a", "b"]


def test_an_error_a_task_ends_with_is_raised() -> None:
    async def broken() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("clean-up failed")

    async def main() -> None:
        task = asyncio.create_task(broken())
        await asyncio.sleep(0)
        await cancel_and_wait(task)

    with pytest.raises(RuntimeError, match="clean-up failed"):
        asyncio.run(main())
