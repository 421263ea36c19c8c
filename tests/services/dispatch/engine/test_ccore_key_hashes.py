"""The compiled index key hashes (``tide.format._ccore.index_key_hashes_ascii``, behind
``key_hashes``) against the Python references: equal hashes for random ASCII keys of
any lengths and shared prefixes (Java's hashCode wraps, Integer.MIN_VALUE maps to 0);
None for a non-ASCII key or prefix, so that ``key_hashes`` takes the reference. Skipped
when the extension is not built (test_core_selection fails if it should have been)."""

from __future__ import annotations

import random
from array import array

import pytest

from services.dispatch.engine.key_hashes import key_hashes, key_hashes_python
from tide.format import _core, index_key_hash, index_key_hashes

pytestmark = pytest.mark.skipif(
    _core.index_key_hashes_ascii is None, reason="the compiled core is not built or is off"
)


def compiled(keys: list[bytes], prefix: bytes) -> list[int] | None:
    """The compiled hashes as a list (they come as an array('q'): no int object a key)."""
    assert _core.index_key_hashes_ascii is not None
    hashes = _core.index_key_hashes_ascii(keys, prefix)
    if hashes is None:
        return None
    assert type(hashes) is array and hashes.typecode == "q"
    return hashes.tolist()


@pytest.mark.parametrize("seed", range(100))
def test_ascii_keys_hash_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    shared = bytes(rnd.randrange(128) for _ in range(rnd.randint(0, 5)))
    keys = [
        shared + bytes(rnd.randrange(128) for _ in range(rnd.randint(0, 40)))
        for _ in range(rnd.randint(0, 30))
    ]
    prefix = rnd.choice([b"", b"TopicTest#", b"x" * 300])
    assert compiled(keys, prefix) == key_hashes_python(keys, prefix)
    assert compiled(keys, prefix) == index_key_hashes(keys, prefix)


def test_integer_min_value_hashes_to_zero() -> None:
    # "polygenelubricants" hashes to Integer.MIN_VALUE in Java
    assert index_key_hash("polygenelubricants") == 0
    assert compiled([b"polygenelubricants"], b"") == [0]


def test_non_ascii_keys_go_to_the_reference() -> None:
    keys = [b"k1", "é".encode(), b"k3"]
    assert compiled(keys, b"T#") is None
    assert compiled([b"k1"], "Ü#".encode()) is None
    assert list(key_hashes(keys, b"T#")) == index_key_hashes(keys, b"T#")


@pytest.mark.parametrize("prefix_len", range(10))
def test_every_length_around_the_eight_byte_steps(prefix_len: int) -> None:
    # The compiled hash takes eight bytes a step, then one at a time; the ASCII check
    # tests eight bytes at a time too: every split of a key into steps and a rest, with
    # the highest ASCII byte and a non-ASCII byte at each position.
    rnd = random.Random(prefix_len)
    prefix = bytes(rnd.randrange(128) for _ in range(prefix_len))
    keys = [bytes(rnd.randrange(128) for _ in range(n)) for n in range(26)]
    keys += [b"\x7f" * n for n in range(26)]
    assert compiled(keys, prefix) == index_key_hashes(keys, prefix)
    for length in range(1, 18):
        for at in range(length):
            key = bytearray(b"a" * length)
            key[at] = 0x80
            assert compiled([bytes(key)], prefix) is None, (length, at)
            assert compiled([b"k"], prefix + bytes(key)) is None, (length, at)
