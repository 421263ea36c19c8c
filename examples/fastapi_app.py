"""A FastAPI app on tide.client.aio (docs/client.md, "The asyncio client").

POST /messages  {"body": "...", "key": "..."}  produces a message and answers where it
                was stored; GET /messages  answers the last messages the app's push
                consumer received (newest last). The producer and the consumer live as
                long as the app: opened and closed by its lifespan, on uvicorn's loop.

    pip install -e '.[dev]'   # FastAPI and uvicorn
    TIDE_GATEWAY=127.0.0.1:8081 TIDE_TOPIC=TopicTest TIDE_GROUP=web-app \\
        uvicorn --app-dir examples fastapi_app:app --port 8000
"""

from __future__ import annotations

import collections
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from tide.client import (
    InvalidArgument,
    ReceivedMessage,
    ResourceExhausted,
    TideError,
    TopicNotFound,
    Unavailable,
)
from tide.client.aio import Producer, PushConsumer

GATEWAY = os.environ.get("TIDE_GATEWAY", "127.0.0.1:8081")
TOPIC = os.environ.get("TIDE_TOPIC", "TopicTest")
GROUP = os.environ.get("TIDE_GROUP", "web-app")
# Where the group starts in a queue it has no offset for: "last" (new messages) or "first".
CONSUME_FROM = os.environ.get("TIDE_CONSUME_FROM", "last")
# The GET answer's bound: the consumer keeps this many of the last messages.
KEEP_MESSAGES = 100
MAX_BODY_CHARS = 64 * 1024


class Outgoing(BaseModel):
    body: str = Field(max_length=MAX_BODY_CHARS)
    key: str | None = Field(default=None, max_length=128)


class Stored(BaseModel):
    msg_id: str
    broker: str
    queue_id: int
    queue_offset: int


class Received(BaseModel):
    msg_id: str
    body: str
    keys: list[str]
    queue_offset: int


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    last: collections.deque[Received] = collections.deque(maxlen=KEEP_MESSAGES)

    async def keep(message: ReceivedMessage) -> None:
        body = message.body.decode("utf-8", "replace")
        last.append(
            Received(
                msg_id=message.msg_id,
                body=body,
                keys=list(message.keys),
                queue_offset=message.queue_offset,
            )
        )

    async with (
        Producer(GATEWAY) as producer,
        PushConsumer(GROUP, TOPIC, "*", keep, GATEWAY, consume_from=CONSUME_FROM) as consumer,
    ):
        app.state.producer = producer
        app.state.consumer = consumer
        app.state.last = last
        yield  # the app serves; leaving closes both (the consumer commits first)


app = FastAPI(title="Tide asyncio example", lifespan=lifespan)


@app.post("/messages", status_code=201)
async def produce(outgoing: Outgoing, request: Request) -> Stored:
    producer: Producer = request.app.state.producer
    keys = [outgoing.key] if outgoing.key else []
    try:
        result = await producer.send(TOPIC, outgoing.body, keys=keys)
    except (InvalidArgument, TopicNotFound) as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from exc
    except (ResourceExhausted, Unavailable) as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from exc
    except TideError as exc:
        raise HTTPException(status_code=502, detail=str(exc)) from exc
    return Stored(
        msg_id=result.msg_id,
        broker=result.queue.broker_name,
        queue_id=result.queue.queue_id,
        queue_offset=result.queue_offset,
    )


@app.get("/messages")
async def received(request: Request) -> list[Received]:
    return list(request.app.state.last)


@app.get("/health")
async def health(request: Request) -> dict[str, object]:
    consumer: PushConsumer = request.app.state.consumer
    return {"queues": [str(q) for q in consumer.assignment()]}
