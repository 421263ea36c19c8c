"""Java's String.hashCode and the RocketMQ hashes built on it.

Every expected value below was also printed by a real JVM (``"...".hashCode()``).
"""

from __future__ import annotations

import pytest

from tide.format import index_key_hash, java_string_hashcode, tags_code

INT_MIN = -(2**31)


def _reference(s: str) -> int:
    """The textbook loop over UTF-16 code units, in 32-bit two's complement."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("abc", 96354),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("TagA", 2598919),  # 84*31^3 + 97*31^2 + 103*31 + 65
        ("TopicTest", -1902610879),  # overflows: negative
        ("Hello World", -862545276),
        ("polygenelubricants", INT_MIN),
        ("TopicTest#k1", 2746024),
        ("é", 233),  # BMP, non-ASCII: one code unit
        ("😀", 1772899),  # U+1F600 = 0xD83D 0xDE00: 31*55357 + 56832
        ("中文key#😀x", 1524651287),
        ("\ud83d", 55357),  # a lone surrogate is one code unit, as in a Java String
        ("x" * 1000, -1715418112),  # longer than one chunk of the fast path
        ("y" * 257, -1353158535),  # one unit past a chunk boundary
    ],
)
def test_java_vectors(text: str, expected: int) -> None:
    assert java_string_hashcode(text) == expected
    assert _reference(text) == expected


def test_collisions_are_java_collisions() -> None:
    assert java_string_hashcode("Aa") == java_string_hashcode("BB")
    # A common prefix keeps the collision (what makes index key hashes collide).
    assert java_string_hashcode("T#Aa") == java_string_hashcode("T#BB")
    assert java_string_hashcode("T#Aa") != java_string_hashcode("T#AB")


@pytest.mark.parametrize("length", [0, 1, 2, 255, 256, 257, 511, 512, 513, 2000])
def test_matches_reference_around_chunk_boundaries(length: int) -> None:
    ascii_text = "".join(chr(33 + (i * 7) % 90) for i in range(length))
    mixed = "".join(("é", "😀", "z", "中")[i % 4] for i in range(length))
    assert java_string_hashcode(ascii_text) == _reference(ascii_text)
    assert java_string_hashcode(mixed) == _reference(mixed)


def test_result_is_a_signed_int32() -> None:
    for text in ("TopicTest", "x" * 1000, "polygenelubricants", "Ω" * 77):
        assert INT_MIN <= java_string_hashcode(text) < 2**31


def test_tags_code() -> None:
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919
    assert tags_code("TopicTest") == -1902610879  # stays negative when widened to 64 bits
    assert tags_code("a || b") == java_string_hashcode("a || b")  # the whole string, unsplit


def test_index_key_hash() -> None:
    assert index_key_hash("TopicTest") == 1902610879  # abs of a negative hash
    assert index_key_hash("hello") == 99162322
    assert index_key_hash("polygenelubricants") == 0  # abs(Integer.MIN_VALUE) overflows
