"""The one-topic layout check (ChunkScanner._one_topic: every record of the first
record's topic, checked with one comparison over the chunk) against the per-record path,
on streams of one topic damaged where that check looks: the topic length byte, the topic,
the properties length, the properties."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.tail.test_batch import _outcome, _PerRecordOnly, check_batch, make_record
from tide.tail import RecordAssembler
from tide.tail._batch import HEAD_V4_BYTES


def one_topic_stream(rnd: random.Random, count: int, topic: str) -> tuple[bytes, list[int]]:
    parts: list[bytes] = []
    offsets: list[int] = []
    offset = 0
    for index in range(count):
        props = rnd.choice([{}, {"KEYS": f"k{index}"}, {"TAGS": "t" * rnd.randrange(300)}])
        body = b"b" * rnd.choice([0, 3, 128])
        data = make_record(offset, body, topic=topic, queue_offset=index, props=props)
        parts.append(data)
        offsets.append(offset)
        offset += len(data)
    return b"".join(parts), offsets


def test_a_stream_of_one_topic_matches_scan_record() -> None:
    stream, offsets = one_topic_stream(random.Random(1), 200, "OneTopic")
    check_batch(RecordAssembler(0).feed_batch(0, stream), stream, 0, offsets)


@pytest.mark.parametrize("seed", range(60))
def test_damage_to_topic_and_properties_gives_what_the_per_record_path_gives(
    seed: int,
) -> None:
    rnd = random.Random(seed)
    stream, offsets = one_topic_stream(rnd, 40, rnd.choice(["T", "OneTopic", "Tópico"]))
    data = bytearray(stream)
    for _ in range(rnd.randrange(1, 3)):
        index = rnd.randrange(len(offsets))
        body_len = int.from_bytes(data[offsets[index] + 84 : offsets[index] + 88], "big")
        topic_pos = offsets[index] + HEAD_V4_BYTES + body_len
        where = topic_pos + rnd.choice([0, 1, 2, data[topic_pos] + 1, data[topic_pos] + 2])
        where = min(where + rnd.choice([0, 0, 1, 5]), len(data) - 1)
        data[where] = rnd.choice([0, 1, 2, 0x7F, 0xFF, rnd.randrange(256)])
    cuts = sorted(rnd.sample(range(1, len(data)), rnd.randrange(0, 4)))
    bounds = [0, *cuts, len(data)]
    chunks = [(a, bytes(data[a:b])) for a, b in itertools.pairwise(bounds) if b > a]
    per_record = RecordAssembler(0)
    per_record._scanner = _PerRecordOnly(per_record._max_record_bytes)
    assert _outcome(RecordAssembler(0), chunks) == _outcome(per_record, chunks)
