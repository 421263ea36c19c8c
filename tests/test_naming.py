from __future__ import annotations

import pytest

from tide.naming import (
    CONSUMER_GROUP_MAX_CHARS,
    TAG_MAX_CHARS,
    TOPIC_MAX_BYTES,
    consumer_group_error,
    tag_error,
    topic_error,
)


@pytest.mark.parametrize(
    "topic", ["a", "TopicTest", "%RETRY%group_1", "a|b", "x-y_z", "9", "a" * TOPIC_MAX_BYTES]
)
def test_valid_topics(topic: str) -> None:
    assert topic_error(topic) is None


def test_empty_topic() -> None:
    assert topic_error("") == "topic is empty; give a name of 1 to 127 bytes"


def test_bad_char_message_says_what_to_fix() -> None:
    assert topic_error("a b") == (
        "topic 'a b' contains ' ' at index 1; allowed characters are ASCII letters, digits, "
        "'%', '|', '_' and '-'"
    )


@pytest.mark.parametrize(
    ("topic", "char", "index"),
    [("../x", ".", 0), ("a/b", "/", 1), ("a\\b", "\\", 1), ("a\x00", "\x00", 1), (".", ".", 0)],
)
def test_path_escapes_are_rejected(topic: str, char: str, index: int) -> None:
    error = topic_error(topic)
    assert error is not None
    assert f"contains {char!r} at index {index}" in error


def test_topic_of_128_bytes_is_too_long() -> None:
    error = topic_error("a" * 128)
    assert error is not None
    assert "is 128 bytes in UTF-8; the limit is 127 bytes" in error
    assert "..." in error  # the name is shortened in the message


def test_multi_byte_char_crossing_127_bytes_is_too_long() -> None:
    topic = "a" * 126 + "é"  # 127 characters, 128 bytes
    assert len(topic) == TOPIC_MAX_BYTES
    error = topic_error(topic)
    assert error is not None
    assert "128 bytes" in error


def test_multi_byte_char_within_127_bytes_is_a_charset_error() -> None:
    error = topic_error("a" * 125 + "é")  # 127 bytes
    assert error is not None
    assert "contains 'é' at index 125" in error


def test_lone_surrogate_does_not_crash() -> None:
    error = topic_error("a\ud800")
    assert error is not None
    assert "index 1" in error


@pytest.mark.parametrize("group", ["g", "please_rename_unique_group_name_4", "%|-_", "G" * 255])
def test_valid_groups(group: str) -> None:
    assert consumer_group_error(group) is None


def test_group_errors() -> None:
    assert consumer_group_error("") is not None
    too_long = consumer_group_error("g" * (CONSUMER_GROUP_MAX_CHARS + 1))
    assert too_long is not None
    assert "is 256 characters long; the limit is 255" in too_long
    bad = consumer_group_error("g@h")
    assert bad is not None
    assert bad.startswith("consumer group 'g@h' contains '@' at index 1")


def test_the_fast_pattern_and_the_character_set_agree() -> None:
    """A name is accepted at once by one pattern and explained by a loop over a set: both
    say the same for every character (ASCII, Latin-1, other scripts, surrogates, newline
    at the end)."""
    from tide import naming

    for code in [*range(0x300), 0x0660, 0x0966, 0xFF10, 0xD800, 0x1F600]:
        char = chr(code)
        in_set = char in naming._ALLOWED_CHARS
        assert (naming._ALLOWED_NAME.fullmatch(char) is not None) == in_set, hex(code)
        assert (topic_error(f"ab{char}") is None) == in_set, hex(code)
    assert topic_error("abc\n") is not None


# -- tags ------------------------------------------------------------------------------
@pytest.mark.parametrize("tag", ["TagA", "Tag With Space", "a&b", "ünï", "x" * TAG_MAX_CHARS])
def test_valid_tags_are_selectable(tag: str) -> None:
    """A tag produce accepts is one an expression can select: the same rule."""
    from services.gateway.expression import parse_expression

    assert tag_error(tag) is None
    assert parse_expression(tag).matches(tag)


@pytest.mark.parametrize(
    ("tag", "fragment"),
    [
        ("A||B", "contains '|'"),
        ("A|B", "contains '|'"),
        ("*", "contains '*'"),
        ("   ", "is blank"),
        (" A", "whitespace"),
        ("A\t", "whitespace"),
        ("A\x00B", "control character"),
        ("A\x85B", "control character"),  # Java's isISOControl: U+007F..U+009F too
        ("x" * (TAG_MAX_CHARS + 1), f"the limit is {TAG_MAX_CHARS}"),
    ],
)
def test_tags_no_expression_can_select_are_refused(tag: str, fragment: str) -> None:
    from services.gateway.expression import ExpressionError, parse_expression

    error = tag_error(tag)
    assert error is not None and fragment in error, error
    assert len(error) < 300
    try:  # and no expression names it: the parser refuses it or reads something else
        parsed = parse_expression(tag)
    except ExpressionError:
        return
    assert tag not in parsed.tags


def test_the_fast_tag_pattern_and_the_tag_rules_agree() -> None:
    """A tag is accepted at once by one pattern and explained by the rules one by one:
    both say the same for every character at the start, inside and at the end (control
    characters, C1, Unicode spaces, '|', '*', other scripts, surrogates) and for random
    tags made of them."""
    import random

    from tide import naming

    codes = [*range(0x300), 0x0660, 0x1680, 0x2000, 0x2028, 0x3000, 0xFEFF, 0xD800, 0x1F600]
    for code in codes:
        char = chr(code)
        for tag in (char, f"a{char}b", f"{char}b", f"a{char}", char * 3):
            fast = naming._VALID_TAG.fullmatch(tag) is not None
            assert fast == (naming._tag_rule_error(tag) is None), (hex(code), tag)
            assert (tag_error(tag) is None) == fast, (hex(code), tag)
    pool = [chr(code) for code in codes]
    rng = random.Random(17)
    for _ in range(2000):
        tag = "".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
        assert (naming._VALID_TAG.fullmatch(tag) is not None) == (
            naming._tag_rule_error(tag) is None
        ), tag
