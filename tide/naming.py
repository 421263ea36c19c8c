"""Name rules shared by every service: topics, consumer groups and tags.

RocketMQ's charset ``[%|a-zA-Z0-9_-]``. A v1 record stores the topic length in one
byte, so a topic is at most 127 bytes of UTF-8. Topics become directory names
(``consumequeue/<topic>/``); the charset has no '/', '.', '\\' or NUL, so a valid name
can never escape its directory.
"""

from __future__ import annotations

import re
import string

from tide.quoting import quote

TOPIC_MAX_BYTES = 127
CONSUMER_GROUP_MAX_CHARS = 255
TAG_MAX_CHARS = 1_024

_ALLOWED_CHARS = frozenset(string.ascii_letters + string.digits + "%|_-")
_ALLOWED_TEXT = "ASCII letters, digits, '%', '|', '_' and '-'"
# The same set as one pattern: a valid name is told in one C call (names are checked on
# every pull and produce; the loop below only finds what to say about a bad one).
_ALLOWED_NAME = re.compile(r"[A-Za-z0-9%|_\-]+")
_TAG_RESERVED = ("|", "*")
# A tag every rule of tag_error accepts (checked per stored message: one match instead
# of the rules one by one): no control character, '|' or '*', and no whitespace at
# either end. tests/test_naming.py holds it to the same answers as the rules.
_VALID_TAG = re.compile(r"(?!\s)[^\x00-\x1f\x7f-\x9f|*]+(?<!\s)")


def topic_error(topic: str) -> str | None:
    """What is wrong with this topic name, or None when it is valid."""
    if not topic:
        return "topic is empty; give a name of 1 to 127 bytes"
    size_bytes = len(topic.encode("utf-8", errors="surrogatepass"))
    if size_bytes > TOPIC_MAX_BYTES:
        return (
            f"topic {_show(topic)} is {size_bytes} bytes in UTF-8; "
            f"the limit is {TOPIC_MAX_BYTES} bytes"
        )
    return _charset_error("topic", topic)


def consumer_group_error(group: str) -> str | None:
    """What is wrong with this consumer group name, or None when it is valid."""
    if not group:
        return f"consumer group is empty; give a name of 1 to {CONSUMER_GROUP_MAX_CHARS} characters"
    if len(group) > CONSUMER_GROUP_MAX_CHARS:
        return (
            f"consumer group {_show(group)} is {len(group)} characters long; "
            f"the limit is {CONSUMER_GROUP_MAX_CHARS}"
        )
    return _charset_error("consumer group", group)


def tag_error(tag: str) -> str | None:
    """What is wrong with a message's tag, or None when a subscription can select it.

    RocketMQ 5's rule (its proxy refuses a blank tag, a '|' and control characters), and
    what else no expression can select: '*' (an expression's "every message") and
    leading or trailing whitespace (an expression's tags are trimmed). The gateway's
    expression parser applies the same rule to each tag it is given."""
    if len(tag) <= TAG_MAX_CHARS and _VALID_TAG.fullmatch(tag):
        return None
    return _tag_rule_error(tag)


def _tag_rule_error(tag: str) -> str | None:
    """tag_error's rules one by one: which one a tag breaks."""
    if len(tag) > TAG_MAX_CHARS:
        return f"tag {_show(tag)} is {len(tag)} characters; the limit is {TAG_MAX_CHARS}"
    if not tag.strip():
        return f"tag {_show(tag)} is blank; give a tag with a visible character or none"
    if tag != tag.strip():
        return (
            f"tag {_show(tag)} starts or ends with whitespace, which no expression can "
            "select (expressions are trimmed)"
        )
    for char in _TAG_RESERVED:
        if char in tag:
            return (
                f"tag {_show(tag)} contains {char!r}, which no expression can select "
                "('||' separates tags, '*' alone means every message)"
            )
    for index, char in enumerate(tag):
        if _is_control(char):
            return f"tag {_show(tag)} contains {char!r} (a control character) at index {index}"
    return None


def _is_control(char: str) -> bool:
    """Java's Character.isISOControl (RocketMQ's check): U+0000..U+001F, U+007F..U+009F."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F


def _charset_error(kind: str, name: str) -> str | None:
    if _ALLOWED_NAME.fullmatch(name):
        return None
    for index, char in enumerate(name):
        if char not in _ALLOWED_CHARS:
            return (
                f"{kind} {_show(name)} contains {char!r} at index {index}; "
                f"allowed characters are {_ALLOWED_TEXT}"
            )
    return None


def _show(name: str) -> str:
    return quote(name)
