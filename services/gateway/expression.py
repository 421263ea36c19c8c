"""Tag subscription expressions (RocketMQ's FilterAPI.buildSubscriptionData, TAG type).

``""`` or ``"*"`` matches every message. Otherwise tags separated by ``||``, each
trimmed: ``"TagA || TagB"`` matches messages whose TAGS is exactly one of them. Each tag
follows the rule produce applies (tide.naming.tag_error), so any tag a message may
carry can be selected, and nothing else can be written. The dispatch service
prefilters consume queue entries by the tags' Java hash codes; the gateway then checks
the real tags (two tags can share a hash code).
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.format import tags_code
from tide.limits import EXPRESSION_MAX_CHARS, EXPRESSION_MAX_TAGS, limit_text, quote
from tide.naming import tag_error

SUB_ALL = "*"
_SEPARATOR = "||"


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
    if len(expression) > EXPRESSION_MAX_CHARS:
        raise ExpressionError(
            f"expression is {len(expression)} characters; the limit is "
            f"{limit_text('EXPRESSION_MAX_CHARS')}"
        )
    tags: list[str] = []
    for index, part in enumerate(text.split(_SEPARATOR)):
        tag = part.strip()
        if not tag:
            raise ExpressionError(
                f"expression {quote(expression)}: tag {index + 1} is empty; write '*' for all "
                "messages or tags separated by '||', e.g. 'TagA || TagB'"
            )
        error = tag_error(tag)
        if error is not None:
            raise ExpressionError(
                f"expression {quote(expression)}: {error}; write '*' alone for all messages "
                "or tags separated by '||', e.g. 'TagA || TagB'"
            )
        tags.append(tag)
    unique = frozenset(tags)
    if len(unique) > EXPRESSION_MAX_TAGS:
        raise ExpressionError(
            f"expression has {len(unique)} tags; the limit is {limit_text('EXPRESSION_MAX_TAGS')}"
        )
    return TagFilter(unique, tuple(sorted({tags_code(tag) for tag in unique})))
