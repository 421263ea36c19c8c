"""The asyncio follower of a storage's commitlog over gRPC (``Storage/Tail``): kept out
of ``tide.tail``'s package so that the records and the assembler load no gRPC."""

from tide.tail._follower import (
    CHANNEL_OPTIONS,
    MAX_CHUNK_BYTES,
    RETRYABLE_CODES,
    ChannelFactory,
    TailFollower,
    insecure_channel,
    parse_tail_chunk,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "MAX_CHUNK_BYTES",
    "RETRYABLE_CODES",
    "ChannelFactory",
    "TailFollower",
    "insecure_channel",
    "parse_tail_chunk",
]
