"""Tag subscription expressions (RocketMQ's FilterAPI.buildSubscriptionData, TAG type).

``""`` or ``"*"`` matches every message. Otherwise tags separated by ``||``, each
trimmed: ``"TagA || TagB"`` matches messages whose TAGS is exactly one of them. The
dispatch service prefilters consume queue entries by the tags' Java hash codes; the
gateway then checks the real tags (two tags can share a hash code).
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.format import tags_code

MAX_EXPRESSION_CHARS = 4096
MAX_EXPRESSION_TAGS = 256
SUB_ALL = "*"
_SEPARATOR = "||"
_FORBIDDEN = ("|", "*", "\x01", "\x02")


class ExpressionError(ValueError):
    """An expression that is not ``*`` or tags separated by ``||``; says what is wrong."""


@dataclass(frozen=True, slots=True)
class TagFilter:
    """``tags`` empty means "every message"."""

    tags: frozenset[str]
    codes: tuple[int, ...]

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def matches(self, tags: str) -> bool:
        return not self.tags or tags in self.tags


MATCH_ALL = TagFilter(frozenset(), ())


def parse_expression(expression: str) -> TagFilter:
    """Parse a tag expression; raise ExpressionError naming the problem."""
    text = expression.strip()
    if not text or text == SUB_ALL:
        return MATCH_ALL
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(
            f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
        )
    tags: list[str] = []
    for index, part in enumerate(text.split(_SEPARATOR)):
        tag = part.strip()
        if not tag:
            raise ExpressionError(
                f"expression {expression[:80]!r}: tag {index + 1} is empty; write '*' for all "
                "messages or tags separated by '||', e.g. 'TagA || TagB'"
            )
        for char in _FORBIDDEN:
            if char in tag:
                raise ExpressionError(
                    f"expression {expression[:80]!r}: tag {tag[:40]!r} contains {char!r}; "
                    "write '*' alone for all messages or tags separated by '||', "
                    "e.g. 'TagA || TagB'"
                )
        tags.append(tag)
    unique = frozenset(tags)
    if len(unique) > MAX_EXPRESSION_TAGS:
        raise ExpressionError(
            f"expression has {len(unique)} tags; the limit is {MAX_EXPRESSION_TAGS}"
        )
    return TagFilter(unique, tuple(sorted({tags_code(tag) for tag in unique})))
