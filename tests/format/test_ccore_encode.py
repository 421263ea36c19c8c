"""The compiled run encoder (``tide.format._ccore.encode_run_v4``, behind
``RunWriter.add_many``) against its Python reference (``RunWriter.add_many_python``):
byte-identical runs for random batches (V1 and V2 topics, empty and large bodies,
properties up to their limit, any queue ids, bytes-like bodies), which the store's check
reads back. Skipped when the extension is not built (test_core_selection fails if it
should have been)."""

from __future__ import annotations

import random

import pytest

from tide.format import (
    MAX_PROPERTIES_BYTES,
    HostAddress,
    RunWriter,
    _core,
    pack_host,
    scan_run,
    topic_part,
)

pytestmark = pytest.mark.skipif(
    _core.encode_run_v4 is None, reason="the compiled core is not built or is off"
)
V4 = pack_host(HostAddress("10.0.0.7", 10911))


def both(
    topic: bytes, ids: list[int], bodies: list[bytes], props: list[bytes], born_ms: int
) -> tuple[bytes, bytes]:
    magic, part = topic_part(topic)
    compiled, python = RunWriter(V4), RunWriter(V4)
    compiled.add_many(magic, part, ids, bodies, props, born_ms)
    python.add_many_python(magic, part, ids, bodies, props, born_ms)
    assert compiled.count == python.count == len(bodies)
    return compiled.getvalue(), python.getvalue()


@pytest.mark.parametrize("seed", range(80))
def test_random_batches_encode_byte_identical(seed: int) -> None:
    rnd = random.Random(seed)
    count = rnd.randint(0, 40)
    topic = rnd.choice([b"T", b"TopicTest", "Ü".encode() * 70, b"x" * 32767])
    ids = [rnd.choice([0, 1, 7, 2**31 - 1, -1]) for _ in range(count)]
    bodies = [rnd.randbytes(rnd.choice([0, 1, 128, 5000])) for _ in range(count)]
    props = [rnd.randbytes(rnd.choice([0, 3, 200, MAX_PROPERTIES_BYTES])) for _ in range(count)]
    born_ms = rnd.choice([0, 1_700_000_000_000, 2**63 - 1, -(2**63)])
    compiled, python = both(topic, ids, bodies, props, born_ms)
    assert compiled == python
    if count:
        assert scan_run(compiled, 1 << 20).count == count


def test_bytes_like_bodies_encode_as_bytes() -> None:
    compiled, python = both(b"T", [0, 1], [bytearray(b"ab"), memoryview(b"cd")], [b"", b""], 5)  # type: ignore[list-item]
    assert compiled == python
