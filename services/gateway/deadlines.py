"""The deadlines of the calls over the request-stream pools: one timer per timeout value.

``asyncio.timeout`` arms a timer handle for every call and cancels it when the call
ends, inside a ``Timeout`` context of its own: ~5 us a call on uvloop in a warm loop,
7-9 us on the loaded box, paid by every append, read and entries call the gateway makes
over a stream (docs/performance.md, "One deadline timer per timeout"). Those calls all
take the same timeout (``--broker-timeout-ms``), so their deadlines come in the order
the calls started: they wait in one first-in-first-out queue per timeout value, and one
timer waits for the oldest pending deadline. A call that ends marks its deadline done
(the done ones at the front leave at once, so a queue holds about the calls in flight);
the timer, armed only when a queue had none, fires at most once per timeout between
calls, drops the done ones and moves on to the next pending deadline. One that passed
cancels its call's task, as ``asyncio.timeout`` does, and the call tells the two
cancellations apart the same way (``Task.uncancel``).
"""

from __future__ import annotations

import asyncio
from collections import deque

_PENDING, _DONE, _EXPIRED = 0, 1, 2


class Deadline:
    """One call's: when it passes, the task it cancels, and what became of it."""

    __slots__ = ("at", "cancelling", "queue", "state", "task")

    def __init__(self, at: float, task: asyncio.Task[object], queue: _Queue) -> None:
        self.at = at
        self.task = task
        self.cancelling = task.cancelling()  # cancellations asked before this call's
        self.state = _PENDING
        self.queue = queue

    def end(self) -> None:
        """The call ended, whichever way."""
        self.queue.done(self)

    def timed_out(self) -> bool:
        """Whether the CancelledError being handled in the task came from this deadline
        alone (the call ends as timed out, and the cancellation is withdrawn), not from
        someone cancelling the task too (then it goes on)."""
        return self.state == _EXPIRED and self.task.uncancel() <= self.cancelling


class _Queue:
    """The pending deadlines of one timeout value, in the order they pass, and the one
    timer that waits for the oldest."""

    __slots__ = ("_deadlines", "_entries", "_timeout_s", "_timer", "loop")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, deadlines: Deadlines, timeout_s: float
    ) -> None:
        self.loop = loop
        self._entries: deque[Deadline] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._deadlines = deadlines
        self._timeout_s = timeout_s

    def add(self, deadline: Deadline) -> None:
        # The same timeout from a later start: never before the last one queued.
        self._entries.append(deadline)
        if self._timer is None:
            self._timer = self.loop.call_at(deadline.at, self._fire)

    def done(self, deadline: Deadline) -> None:
        if deadline.state == _PENDING:
            deadline.state = _DONE
        entries = self._entries
        while entries and entries[0].state != _PENDING:
            entries.popleft()

    def _fire(self) -> None:
        """The oldest deadline's time (or a later one's, if it ended): cancel the calls
        whose deadlines passed, re-arm for the next pending one, or let the queue go."""
        self._timer = None
        now = self.loop.time()
        entries = self._entries
        while entries:
            head = entries[0]
            if head.state != _PENDING:
                entries.popleft()
            elif head.at > now:
                self._timer = self.loop.call_at(head.at, self._fire)
                return
            else:
                entries.popleft()
                head.state = _EXPIRED
                head.task.cancel()
        self._deadlines.forget(self._timeout_s, self)  # nothing pending: the timer is off


class Deadlines:
    """The deadlines of one loop's calls, a queue per timeout value in use (each queue
    lives while it has a deadline pending or a timer armed: the callers' timeouts are
    configuration, so there are about as many queues as settings)."""

    def __init__(self) -> None:
        self._queues: dict[float, _Queue] = {}

    def start(self, timeout_s: float) -> Deadline:
        """The current task's deadline, ``timeout_s`` from now."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None, "a deadline cancels a task: start it in one"
        queue = self._queues.get(timeout_s)
        if queue is None or queue.loop is not loop:  # (a closed loop's timer never fires)
            queue = self._queues[timeout_s] = _Queue(loop, self, timeout_s)
        deadline = Deadline(loop.time() + timeout_s, task, queue)
        queue.add(deadline)
        return deadline

    def forget(self, timeout_s: float, queue: _Queue) -> None:
        if self._queues.get(timeout_s) is queue:
            del self._queues[timeout_s]

    def __len__(self) -> int:
        """Queues kept (tests: bounded by the timeout values in use)."""
        return len(self._queues)
