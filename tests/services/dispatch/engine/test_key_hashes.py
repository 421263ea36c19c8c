"""key_hashes (the dispatch's batch of index key hashes) against tide.format's."""

from __future__ import annotations

import random

import pytest

from services.dispatch.engine.key_hashes import key_hashes
from tide.format import index_key_hash, index_key_hashes


@pytest.mark.parametrize("seed", range(30))
def test_random_keys_hash_as_tide_format_hashes_them(seed: int) -> None:
    """Keys of one length (the fast path) and not, ASCII and not, shared prefixes."""
    rnd = random.Random(seed)
    for _ in range(100):
        alphabet = rnd.choice([b"ab", b"\x00\x7f\x01", bytes(range(128)), b"k0123456789"])
        shared = bytes(rnd.choice(alphabet) for _ in range(rnd.randrange(4)))
        width = rnd.randrange(12)
        count = rnd.randrange(1, 50)
        keys = [shared + bytes(rnd.choice(alphabet) for _ in range(width)) for _ in range(count)]
        if rnd.random() < 0.2:
            keys[rnd.randrange(count)] += b"x"  # one longer
        if rnd.random() < 0.1:
            keys[rnd.randrange(count)] += "é".encode()
        prefix = rnd.choice([b"", b"T#", b"ReplayTopic#", "é#".encode()])
        assert list(key_hashes(keys, prefix)) == index_key_hashes(keys, prefix)


def test_integer_min_value_hashes_to_zero() -> None:
    key = "polygenelubricants"  # Java: hashCode() == Integer.MIN_VALUE
    assert index_key_hash(key) == 0
    assert list(key_hashes([key.encode()] * 3)) == [0, 0, 0]


def test_no_keys() -> None:
    assert list(key_hashes([], b"T#")) == []
