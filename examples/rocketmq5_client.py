"""Tide with the official RocketMQ 5 Python client (docs/rocketmq5.md).

    make rmq5-venv                      # the client in .venv-rmq5 (rocketmq-python-client 5.1.2)
    .venv/bin/tide topic create Orders --message-type NORMAL
    .venv-rmq5/bin/python examples/rocketmq5_client.py 127.0.0.1:8081 Orders OrdersApp

It sends three messages with a tag, a key and a property, then receives and acks them
with a SimpleConsumer. The only Tide-specific thing is the endpoint: the gateway's.
Run it with the client's own Python: its generated protobuf code must not share a
process with Tide's. The client logs under ~/logs/rocketmq-python.
"""

from __future__ import annotations

import sys
import time

from rocketmq import (  # type: ignore[import-not-found]
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

RECEIVE_DEADLINE_S = 60.0
INVISIBLE_DURATION_S = 30  # received messages stay invisible to the group this long


def main(endpoint: str, topic: str, group: str) -> None:
    config = ClientConfiguration(endpoint, Credentials())  # no credentials: not verified yet
    producer = Producer(config, (topic,))
    producer.startup()
    sent = set()
    try:
        for index in range(3):
            message = Message()
            message.topic = topic
            message.body = f"order {index}".encode()
            message.tag = "created"
            message.keys = f"order-{index}"
            message.add_property("region", "eu")
            sent.add(producer.send(message).message_id)
            print(f"sent order-{index}")
    finally:
        producer.shutdown()

    consumer = SimpleConsumer(config, group, {topic: FilterExpression("created")})
    consumer.startup()
    deadline = time.monotonic() + RECEIVE_DEADLINE_S
    try:
        while sent and time.monotonic() < deadline:
            for message in consumer.receive(16, INVISIBLE_DURATION_S):
                print(
                    f"received {message.message_id}: {message.body.decode()} "
                    f"keys={sorted(message.keys)} properties={message.properties}"
                )
                consumer.ack(message)
                sent.discard(message.message_id)
    finally:
        consumer.shutdown()
    if sent:
        sys.exit(f"not received: {sorted(sent)}")
    print("all received and acked")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: rocketmq5_client.py ENDPOINT TOPIC GROUP")
    main(*sys.argv[1:])
