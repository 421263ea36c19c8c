"""Name rules shared by every service: topics and consumer groups.

RocketMQ's charset ``[%|a-zA-Z0-9_-]``. A v1 record stores the topic length in one
byte, so a topic is at most 127 bytes of UTF-8. Topics become directory names
(``consumequeue/<topic>/``); the charset has no '/', '.', '\\' or NUL, so a valid name
can never escape its directory.
"""

from __future__ import annotations

import re
import string

TOPIC_MAX_BYTES = 127
CONSUMER_GROUP_MAX_CHARS = 255

_ALLOWED_CHARS = frozenset(string.ascii_letters + string.digits + "%|_-")
_ALLOWED_TEXT = "ASCII letters, digits, '%', '|', '_' and '-'"
# The same set as one pattern: a valid name is told in one C call (names are checked on
# every pull and produce; the loop below only finds what to say about a bad one).
_ALLOWED_NAME = re.compile(r"[A-Za-z0-9%|_\-]+")
# How much of a bad name an error message repeats.
_SHOWN_CHARS = 40


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
    if len(name) <= _SHOWN_CHARS:
        return repr(name)
    return f"{name[:_SHOWN_CHARS]!r}..."
