"""Held pulls (RocketMQ's PullRequestHoldService) woken by dispatch arrival notices.

A pull that found nothing new waits on an asyncio future keyed by (dispatch address,
topic, queue id): no thread and no timer task per held call, only the future and its
timeout handle. One ``WatchArrivals`` stream per dispatch address (opened when the first
pull is held there, reopened with backoff when it breaks) wakes the waiters of a queue as
soon as its max offset passes their offset. Every ``recheck_interval_s`` the queues with
waiters are also asked for their offsets, in case a notice was missed (a stream that was
down, a notice that raced the pull).

When a dispatch's stream breaks, the pulls held on it are woken at once to read again: a
dispatch (or its storage) that went away makes that read fail over to the broker's slave
(readers.py), where the pull is held on the slave's dispatch arrivals.

Race with the pull's own read: the pull takes :attr:`HeldPulls.sequence` before asking
for entries; a notice recorded after that sequence number wakes it at once.

The watch asks for the arrived entries too (``WatchArrivalsRequest.entries_max_count``):
a notice then carries the queue's new entries with their records, from the offset the
previous notice announced, when a records reader kept up there lately (the dispatch
remembers where one read the queue to its end, for its ``CAUGHT_UP_S``) and the
dispatch's tail cache held them. They are kept a while (arrived.py; taken in before any
pull the notice woke runs): the pull held at that offset (a consumer that keeps up), and
a pull that comes after the notice passed its offset, answer from them without asking the
dispatch (pull.py): one internal call less per arrival.

A records pull at the max offset the open stream last announced for its queue is held
before it reads (:meth:`HeldPulls.hold_at_end`): the dispatch would answer that nothing
is new there. The dispatch carries a queue's entries in its notices for a while after a
records reader read the queue to its end (its ``CAUGHT_UP_S``), so a consumer that keeps
up is answered from the notices and asks the dispatch only now and then (a notice
without entries, a long poll that timed out): at low rates, where each message is its own
notice and pull, that is half of the dispatch's gRPC messages a message.

A pull with ``min_messages`` (fuller pulls, Kafka's fetch.min.bytes) waits here before it
reads (:meth:`HeldPulls.wait_filled`): on the same futures, woken once the queue's max
offset reaches the pull's offset + min_messages, judged from the notices alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from services.gateway.arrived import Answer, ArrivedRecords, QueueKey
from services.gateway.brokers import BrokerChannels, rpc_problem
from tide.limits import PULL_MAX_MESSAGES
from tide.server import ServiceError
from tide.tail import Backoff
from tide.v1 import dispatch_pb2 as dispatch_pb

log = logging.getLogger("tide.gateway.long_poll")

# Queues whose last notice is remembered (for the race above); forgotten all at once past it.
MAX_REMEMBERED_NOTICES = 200_000
# Offsets calls in flight at once during a recheck.
RECHECK_CONCURRENCY = 32
WATCH_BACKOFF = Backoff(initial_s=0.1, max_s=5.0)
# Value a closing gateway wakes its waiters with.
CLOSING = -1
# Value the waiters of a dispatch whose arrivals stream broke are woken with.
WOKEN_BY_BREAK = -2
# Entries a notice carries at most: a pull's max_messages at most (pull.MAX_MESSAGES).
NOTICE_MAX_ENTRIES = PULL_MAX_MESSAGES
# What a waiter is woken with: the queue's new max offset, or one of the values above.
Wake = int


def _time_out(future: asyncio.Future[Wake | None]) -> None:
    if not future.done():
        future.set_result(None)


class HeldPulls:
    def __init__(
        self,
        channels: BrokerChannels,
        *,
        max_held: int,
        recheck_interval_s: float,
        rpc_timeout_s: float,
        notice_max_bytes: int,
        arrived: ArrivedRecords,
    ) -> None:
        """``notice_max_bytes``: the most record bytes a notice carries (the gateway's
        --max-pull-bytes, as a pull's entries); ``arrived`` keeps the records notices
        carry (forgotten with their stream, or a queue that shrank)."""
        self._channels = channels
        self.arrived = arrived
        self._notice_max_bytes = notice_max_bytes
        self._max_held = max_held
        self._recheck_interval_s = recheck_interval_s
        self._rpc_timeout_s = rpc_timeout_s
        self._waiters: dict[QueueKey, dict[asyncio.Future[Wake | None], int]] = {}
        self._held = 0
        self._sequence = 0
        self._notices: dict[QueueKey, tuple[int, int]] = {}  # key -> (max offset, sequence)
        # The max offsets the open arrival streams announced (each address's dropped when
        # its stream ends or opens again): where a pull can be held without reading.
        self._announced: dict[QueueKey, int] = {}
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._recheck: asyncio.Task[None] | None = None
        self._closing = False
        # Pulls held for their min_messages (a metric).
        self.filled_waits = 0
        # Pulls held at the announced end before reading (a metric).
        self.end_waits = 0

    @property
    def held(self) -> int:
        return self._held

    @property
    def sequence(self) -> int:
        """Take before reading a queue; pass to :meth:`wait` as ``since``."""
        return self._sequence

    def start(self) -> None:
        self._recheck = asyncio.create_task(self._recheck_loop(), name="long-poll-recheck")

    def close(self) -> None:
        """Wake every held pull (they answer NO_NEW_MESSAGE) and hold no more."""
        self._closing = True
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(CLOSING)

    async def stop(self) -> None:
        self.close()
        tasks = [*self._watches.values(), *([self._recheck] if self._recheck else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watches.clear()

    # -- waiting -------------------------------------------------------------------
    async def hold_at_end(self, key: QueueKey, offset: int, timeout_s: float) -> bool | None:
        """Hold a pull before it reads when the open arrival stream of the queue's
        dispatch last announced ``offset`` as the queue's max: nothing is there to read
        yet, and the queue's next notice wakes it (:meth:`wait`'s answer). A stream
        announces every queue's max when it opens and every change after (coalesced,
        never dropped), so a pull held on its word misses nothing. None, at once, when
        the stream is not open, said nothing of the queue or another offset, or
        ``--max-held-pulls`` are held: then the pull reads first, as before."""
        if self._closing or self._held >= self._max_held or self._announced.get(key) != offset:
            return None
        since = self._sequence
        self.end_waits += 1
        return await self.wait(key, offset, timeout_s, since)

    async def wait(self, key: QueueKey, offset: int, timeout_s: float, since: int) -> bool:
        """Hold until the queue's max offset passes ``offset`` (True) or the timeout
        (False); the records the waking notice carried are in :attr:`arrived` by then.
        RESOURCE_EXHAUSTED when ``--max-held-pulls`` are held already."""
        if self._closing:
            return False
        notice = self._notices.get(key)
        if notice is not None and notice[1] > since and notice[0] > offset:
            return True
        if self._held >= self._max_held:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._held} pulls are held already, the limit (--max-held-pulls "
                f"{self._max_held}); retry later or pull with a shorter long_poll_timeout_ms",
            )
        woken = await self._hold(key, offset, timeout_s)
        return woken is not None and woken != CLOSING

    def arrived_answer(
        self, key: QueueKey, offset: int, max_messages: int, max_bytes: int
    ) -> Answer | None:
        """The pull's answer from the records the queue's notices carried (arrived.py),
        judged against the max offset the open stream announced last; None when they do
        not hold it, or the stream said nothing of the queue (the pull reads)."""
        announced = self._announced.get(key)
        if announced is None:
            return None
        return self.arrived.answer(key, offset, max_messages, max_bytes, announced)

    async def wait_filled(self, key: QueueKey, offset: int, count: int, timeout_s: float) -> None:
        """Hold until the queue holds at least ``count`` entries past ``offset`` (its max
        offset ``>= offset + count``) or the timeout: a pull's min_messages wait. Returns
        at once when the last notice already says so, or when ``--max-held-pulls`` are
        held (the wait only makes pulls fuller: the pull reads now rather than being
        refused). The notice remembered for the queue is its max offset at some point
        (max offsets only grow), so it is enough to go on without reading."""
        last = offset + count - 1  # woken once the max offset passes it
        notice = self._notices.get(key)
        if self._closing or (notice is not None and notice[0] > last):
            return
        if self._held >= self._max_held:
            return
        self.filled_waits += 1
        await self._hold(key, last, timeout_s)

    async def _hold(self, key: QueueKey, offset: int, timeout_s: float) -> Wake | None:
        """Wait (counted as held) until a notice or recheck says the queue's max offset
        passed ``offset``, or a broken stream or closing wakes it: what woke it, or None
        at the timeout."""
        self._ensure_watch(key[0])
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Wake | None] = loop.create_future()
        waiters = self._waiters.get(key)
        if waiters is None:
            waiters = self._waiters[key] = {}
        waiters[future] = offset
        self._held += 1
        # A timer that ends the wait with None, not an asyncio.timeout: the hold is a
        # future, so nothing needs cancelling (half the cost a pull: ~2.7 us, not ~5.4).
        timer = loop.call_later(timeout_s, _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._held -= 1
            del waiters[future]
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]

    def notify(self, key: QueueKey, max_offset: int) -> None:
        """The queue's max offset is now ``max_offset``: wake the waiters below it. A max
        below the last one known (the queue was rebuilt shorter: a dispatch that
        reconciled with a storage whose recovery cut its commitlog) wakes every waiter
        and forgets the queue's announced end and arrived records: their reads answer
        where they stand (OFFSET_ILLEGAL past the new end) rather than at their
        timeouts."""
        self._sequence += 1
        if key not in self._notices and len(self._notices) >= MAX_REMEMBERED_NOTICES:
            self._notices.clear()
        previous = self._notices.get(key)
        shrank = previous is not None and max_offset < previous[0]
        self._notices[key] = (max_offset, self._sequence)
        if shrank:
            self._announced.pop(key, None)
            self.arrived.forget(key)
        waiters = self._waiters.get(key)
        if not waiters:
            return
        for future, offset in waiters.items():
            if (shrank or offset < max_offset) and not future.done():
                future.set_result(max_offset)

    # -- arrival streams -----------------------------------------------------------
    def _ensure_watch(self, address: str) -> None:
        task = self._watches.get(address)
        if task is None or task.done():
            self._watches[address] = asyncio.create_task(
                self._watch(address), name=f"watch-arrivals-{address}"
            )

    def _has_waiters(self, address: str) -> bool:
        return any(key[0] == address for key in self._waiters)

    async def _watch(self, address: str) -> None:
        """Follow one dispatch's arrivals until no pull waits there and the stream ends."""
        failures = 0
        while not self._closing:
            stub = self._channels.dispatch(address)
            request = dispatch_pb.WatchArrivalsRequest(
                send_current=True,
                entries_max_count=NOTICE_MAX_ENTRIES,
                entries_max_bytes=self._notice_max_bytes,
            )
            self._forget_announced(address)  # a new stream announces everything again
            try:
                async for notice in stub.WatchArrivals(request):
                    failures = 0
                    key = (address, notice.topic, notice.queue_id)
                    self.notify(key, notice.max_offset)  # a shrunk queue forgets its run
                    self.arrived.add(key, notice)  # before the woken pulls look there
                    self._announce(key, notice.max_offset)
                problem = "the stream ended (dispatch stopping)"
            except grpc.aio.AioRpcError as exc:
                problem = rpc_problem(exc)
            finally:
                self._forget_announced(address)
            failures += 1
            if failures == 1:
                self._wake_address(address)
            if not self._has_waiters(address):
                log.debug(
                    "arrivals of %s: %s; no pull waits there, not reconnecting", address, problem
                )
                return
            if failures == 1:
                log.warning("arrivals stream of dispatch %s: %s; reconnecting", address, problem)
            await asyncio.sleep(WATCH_BACKOFF.delay_s(failures))

    def _announce(self, key: QueueKey, max_offset: int) -> None:
        if key not in self._announced and len(self._announced) >= MAX_REMEMBERED_NOTICES:
            self._announced.clear()  # the pulls of the queues forgotten read first
        self._announced[key] = max_offset

    def _forget_announced(self, address: str) -> None:
        """Drop what the address's stream said: its announced ends and arrived records."""
        for key in [key for key in self._announced if key[0] == address]:
            del self._announced[key]
        self.arrived.forget_address(address)

    def _wake_address(self, address: str) -> None:
        """Wake every pull held on ``address`` (its stream broke): they read again."""
        for key, waiters in self._waiters.items():
            if key[0] != address:
                continue
            for future in waiters:
                if not future.done():
                    future.set_result(WOKEN_BY_BREAK)

    # -- recheck -------------------------------------------------------------------
    async def _recheck_loop(self) -> None:
        limit = asyncio.Semaphore(RECHECK_CONCURRENCY)
        while True:
            await asyncio.sleep(self._recheck_interval_s)
            keys = list(self._waiters)
            if keys:
                await asyncio.gather(*(self._recheck_one(key, limit) for key in keys))

    async def _recheck_one(self, key: QueueKey, limit: asyncio.Semaphore) -> None:
        address, topic, queue_id = key
        request = dispatch_pb.GetQueueOffsetsRequest(topic=topic, queue_id=queue_id)
        async with limit:
            if key not in self._waiters:
                return
            try:
                offsets: dispatch_pb.GetQueueOffsetsResponse = await self._channels.dispatch(
                    address
                ).GetQueueOffsets(request, timeout=self._rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                log.debug("recheck of %s/%d on %s: %s", topic, queue_id, address, rpc_problem(exc))
                return
        self.notify(key, offsets.max_offset)
