"""The asyncio Tide client: tide.client's Producer, PullConsumer, PushConsumer and Admin
on ``grpc.aio``, with the same options, errors (tide.client's classes) and semantics.

```python
from tide.client.aio import Producer, PushConsumer

async with Producer("127.0.0.1:8081") as producer:
    result = await producer.send("TopicTest", b"hello", keys=["order-1"])

async def handle(message):
    print(message.queue, message.queue_offset, message.body)

async with PushConsumer("my-group", "TopicTest", "*", handle, consume_from="first"):
    ...  # consumes in tasks on this event loop until the block ends
```

See docs/client.md, "The asyncio client" (cancellation, backpressure, shutdown).
"""

from tide.client.aio._accumulator import Delivery
from tide.client.aio._admin import Admin
from tide.client.aio._producer import Producer, SendOptions, cancelled_delivery
from tide.client.aio._pull_consumer import PullConsumer
from tide.client.aio._push_consumer import PushConsumer

__all__ = [
    "Admin",
    "Delivery",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "SendOptions",
    "cancelled_delivery",
]
