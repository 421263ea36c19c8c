"""The Tide Python client: produce and consume through a gateway.

```python
from tide.client import Producer, PushConsumer

with Producer("127.0.0.1:8081") as producer:
    result = producer.send("TopicTest", b"hello", tags="TagA", keys=["order-1"])

def handle(message):
    print(message.queue, message.queue_offset, message.body)

with PushConsumer("my-group", "TopicTest", "*", handle, consume_from="first"):
    ...  # consumes on background threads until the block ends
```

See docs/client.md.
"""

from tide.auth.client import Credentials
from tide.client._admin import Admin, Recalled
from tide.client._allocate import allocate_averagely
from tide.client._auth_admin import PolicyEntry, UserInfo
from tide.client._errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    TideError,
    TopicNotFound,
    Unauthenticated,
    Unavailable,
)
from tide.client._idempotent import IdempotentProducer, IdempotentSend
from tide.client._producer import MAX_BATCH_MESSAGES, Producer
from tide.client._pull_consumer import PullConsumer
from tide.client._push_consumer import PushConsumer
from tide.client._rpc import DEFAULT_GATEWAY, ClientTls, RetryPolicy
from tide.client._simple_consumer import GroupLag, PopMessage, SimpleConsumer
from tide.client._start_offset import ConsumeFrom
from tide.client._transactions import HalfMessage, TransactionOutcome, TransactionResolution
from tide.client._types import (
    ConsumeResult,
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    QueueOffsets,
    ReceivedMessage,
    SendBackResult,
    SendResult,
    SendStatus,
)
from tide.tls import TlsFiles

__all__ = [
    "DEFAULT_GATEWAY",
    "MAX_BATCH_MESSAGES",
    "Admin",
    "AlreadyExists",
    "ClientTls",
    "ConsumeFrom",
    "ConsumeResult",
    "Credentials",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GroupLag",
    "HalfMessage",
    "IdempotentProducer",
    "IdempotentSend",
    "InvalidArgument",
    "Message",
    "MessageQueue",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "PolicyEntry",
    "PopMessage",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueOffsets",
    "Recalled",
    "ReceivedMessage",
    "ResourceExhausted",
    "RetryPolicy",
    "SendBackResult",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TideError",
    "TlsFiles",
    "TopicNotFound",
    "TransactionOutcome",
    "TransactionResolution",
    "Unauthenticated",
    "Unavailable",
    "UserInfo",
    "allocate_averagely",
]
