"""The choice of event loop (``--event-loop``) in one process; test_bootstrap.py runs a
real service on each."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
import uvloop

from tide.server._event_loop import (
    EVENT_LOOPS,
    LoopFactory,
    loop_factory,
    run_on,
    running_loop_name,
)


def _running_name(factory: LoopFactory) -> tuple[str, type]:
    """What ``running_loop_name`` says inside a loop made by ``factory``, and its type."""

    async def inside() -> tuple[str, type]:
        return running_loop_name(), type(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(inside())


def test_uvloop_is_the_default_and_runs_on_uvloop() -> None:
    assert EVENT_LOOPS[0] == "uvloop"
    assert _running_name(loop_factory("uvloop")) == ("uvloop", uvloop.Loop)


def test_asyncio_runs_on_the_standard_loop() -> None:
    running, loop_type = _running_name(loop_factory("asyncio"))
    assert running == "asyncio"
    assert loop_type.__module__.startswith("asyncio.")


def test_uvloop_that_cannot_be_imported_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    with caplog.at_level(logging.WARNING, logger="tide.server.event_loop"):
        factory = loop_factory("uvloop")
    assert _running_name(factory)[0] == "asyncio"
    (record,) = caplog.records
    assert record.getMessage().startswith("--event-loop uvloop: cannot import uvloop (")
    assert record.getMessage().endswith("); running on asyncio's loop")


def test_an_unknown_loop_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"event loop 'trio' is unknown: one of uvloop, asyncio"):
        loop_factory("trio")


def test_run_on_runs_the_coroutine_to_its_result_on_the_loop_asked_for() -> None:
    async def which() -> str:
        return running_loop_name()

    assert run_on("uvloop", which()) == "uvloop"
    assert run_on("asyncio", which()) == "asyncio"
