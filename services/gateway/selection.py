"""Which queue a produced message goes to (RocketMQ's selectOneMessageQueue).

* Round robin over the topic's writable queues, one counter per topic, skipping brokers
  the latency fault tolerance avoids and brokers that already failed for this request,
  as long as another broker is left.
* A sharding key: ``abs(hashCode(key) % n)`` over the writable queues sorted by (broker,
  queue id) (RocketMQ's SelectMessageQueueByHash), so one key stays on one queue while
  the route does not change. When that queue's broker failed for this request, the key
  is hashed over the queues of the other brokers (the same fallback queue for every
  message of the key).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Collection, Sequence

from services.gateway.fault import LatencyFaultTolerance
from services.gateway.routes import QueueRef
from tide.format import sharding_groups, sharding_key_index
from tide.v1 import gateway_pb2 as pb

# Topics with a round-robin counter (the least recently used are dropped past this).
MAX_COUNTERS = 100_000


hash_index = sharding_key_index  # RocketMQ's Math.abs(key.hashCode() % count)


def by_sharding_key(
    queues: Sequence[QueueRef], key: str, excluded: Collection[str] = ()
) -> QueueRef | None:
    """The queue for ``key``; None when there is no queue outside ``excluded`` brokers."""
    if excluded:
        queues = [queue for queue in queues if queue.broker_name not in excluded]
    if not queues:
        return None
    return queues[hash_index(key, len(queues))]


def sharding_parts(
    messages: Sequence[pb.ProduceMessage], queues: Sequence[QueueRef], *, keyed: bool = False
) -> list[tuple[QueueRef, list[int]]] | None:
    """The batch's message positions by the queue each one's sharding key hashes to
    (:func:`by_sharding_key`'s queue), in order within each queue, the queues in the
    order of their first message, when every message has a sharding key; else None.
    ``keyed``: every message is known to have one (validate.py's keyed_bodies). Spread
    over several queues, a batch with an empty key is None too: the general path sends
    such a message round robin (one queue it would take alone, as one key). Split in one
    compiled call (tide.format.sharding_groups)."""
    if not queues:
        return None
    if not keyed and any(message.WhichOneof("route") != "sharding_key" for message in messages):
        return None
    keys = [message.sharding_key for message in messages]
    groups = sharding_groups(keys, len(queues))
    if len(groups) > 1 and "" in keys:
        return None
    return [(queues[index], positions) for index, positions in groups]


class QueueSelector:
    def __init__(self, fault: LatencyFaultTolerance, rng: random.Random | None = None) -> None:
        self.fault = fault
        self._rng = rng or random.Random()
        self._counters: OrderedDict[str, int] = OrderedDict()

    def _next(self, topic: str) -> int:
        value = self._counters.pop(topic, None)
        if value is None:  # RocketMQ starts each topic's counter at a random value
            value = self._rng.randrange(1 << 16)
        self._counters[topic] = value + 1
        if len(self._counters) > MAX_COUNTERS:
            self._counters.popitem(last=False)
        return value

    def round_robin(
        self, topic: str, queues: Sequence[QueueRef], excluded: Collection[str] = ()
    ) -> QueueRef | None:
        """The next queue: the first one from the counter on whose broker is available and
        not excluded; else the first one not excluded (the least bad broker's, if the fault
        tolerance knows one); None when every queue's broker is excluded."""
        count = len(queues)
        if count == 0:
            return None
        start = self._next(topic)
        fallback: list[QueueRef] = []
        for step in range(count):
            queue = queues[(start + step) % count]
            if queue.broker_name in excluded:
                continue
            if self.fault.is_available(queue.broker_name):
                return queue
            fallback.append(queue)
        if not fallback:
            return None
        least_bad = self.fault.least_bad(queue.broker_name for queue in fallback)
        for queue in fallback:
            if queue.broker_name == least_bad:
                return queue
        return fallback[0]
