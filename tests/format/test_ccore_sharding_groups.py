"""The gateway's split of a FIFO batch by queue in the compiled core
(``_ccore.sharding_groups``) against its pure-Python twin in
``tide/format/_sharding_groups.py``: equal answers on random batches of keys (ASCII,
Latin-1, other BMP text, characters above the BMP, lone surrogates, keys back to back),
on edge cases and damaged input, and where the compiled one declines (None) the twin
answers through ``tide.format.sharding_groups``. Run on the pure-Python path too
(Makefile PURE_PYTHON_TESTS), where the public function is the twin; both are checked
against the rule read key by key (``sharding_key_index``, RocketMQ's hash)."""

from __future__ import annotations

import random

import pytest

from tide.format import _core, java_string_hashcode, sharding_groups, sharding_key_index
from tide.format._sharding_groups import sharding_groups_python

compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")
ALPHABETS = ("abcXYZ019-_:", "äöüßéñ\xff", "中文字段Ωж", "😀🚀\U00010000\U0010ffff", "\ud800\udfff")


def _by_rule(keys: list[str], count: int) -> list[tuple[int, list[int]]]:
    """The answer read key by key: each key's queue, the queues in order of first key."""
    groups: dict[int, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(sharding_key_index(key, count), []).append(position)
    return list(groups.items())


def _key(rnd: random.Random) -> str:
    alphabet = "".join(rnd.sample(ALPHABETS, rnd.randrange(1, 3)))
    return "".join(rnd.choice(alphabet) for _ in range(rnd.choice([0, 1, 5, 20, 300])))


def _keys(rnd: random.Random) -> list[str]:
    distinct = [_key(rnd) for _ in range(rnd.choice([1, 2, 10, 1000]))]
    keys: list[str] = []
    for _ in range(rnd.choice([1, 2, 100, rnd.randrange(1, 1500)])):
        if keys and rnd.random() < 0.3:  # back to back: the same key, or an equal copy
            keys.append(keys[-1] if rnd.random() < 0.5 else "".join(list(keys[-1])))
        else:
            keys.append(rnd.choice(distinct))
    return keys


def test_random_batches_split_alike() -> None:
    rnd = random.Random(27)
    for _ in range(150):
        keys, count = _keys(rnd), rnd.choice([1, 2, 3, 4, 8, 16, 100, rnd.randrange(1, 5000)])
        expected = _by_rule(keys, count)
        assert sharding_groups_python(keys, count) == expected
        assert sharding_groups(keys, count) == expected


@compiled
def test_the_compiled_core_answers_random_batches() -> None:
    assert _core.ccore is not None
    rnd = random.Random(2711)
    for _ in range(150):
        keys, count = _keys(rnd), rnd.randrange(1, 300)
        assert _core.ccore.sharding_groups(keys, count) == sharding_groups_python(keys, count)


@pytest.mark.parametrize(
    ("keys", "count"),
    [
        ([], 1),
        ([], 4),
        ([""], 4),  # hashCode("") == 0: the first queue
        (["polygenelubricants"], 7),  # hashCode == Integer.MIN_VALUE: Math.abs overflows
        (["polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"], 3),  # MIN_VALUE, too
        (["a"] * 5 + ["b"] * 5 + ["a"], 2),
        ([str(i) for i in range(1000)], 1),
        ([str(i) for i in range(1000)], 65536),  # the compiled core's largest table
        ([str(i) for i in range(100)], 65537),  # above it: the twin answers
        (["😀", "\ud83d\ude00", "\ud83d", "\ude00"], 13),  # astral vs surrogates
        (["x" * 100_000], 5),
    ],
)
def test_edge_cases_split_alike(keys: list[str], count: int) -> None:
    expected = _by_rule(keys, count)
    assert sharding_groups_python(keys, count) == expected
    assert sharding_groups(keys, count) == expected


def test_min_value_keys_are_java_s() -> None:
    """The keys above whose hashCode is Integer.MIN_VALUE: the case abs() overflows in Java
    and RocketMQ's remainder comes first (Math.abs(h % n))."""
    assert java_string_hashcode("polygenelubricants") == -(1 << 31)
    assert sharding_key_index("polygenelubricants", 7) == (1 << 31) % 7


@compiled
def test_the_compiled_core_declines_what_it_does_not_take() -> None:
    """None for input other than an exact list of exact str (the twin answers, or
    names what is wrong), or more queues than its table holds."""
    assert _core.ccore is not None

    class Key(str):
        pass

    for keys in (("a", "b"), ["a", b"b"], ["a", None], ["a", Key("b")], iter(["a"])):
        assert _core.ccore.sharding_groups(keys, 4) is None
    assert _core.ccore.sharding_groups(["a"], 65537) is None
    assert sharding_groups([Key("a"), "b"], 4) == _by_rule(["a", "b"], 4)


@pytest.mark.parametrize("count", [0, -1])
def test_no_queue_is_an_error_both_ways(count: int) -> None:
    with pytest.raises(ValueError, match="count must be >= 1"):
        sharding_groups_python(["a"], count)
    with pytest.raises(ValueError, match="count must be >= 1"):
        sharding_groups(["a"], count)


def test_damaged_keys_fail_in_the_twin() -> None:
    """A key that is not text has no Java hash: the twin raises (the compiled core
    declined it above), never a silent queue."""
    with pytest.raises((TypeError, AttributeError)):
        sharding_groups([b"a", "b"], 4)  # type: ignore[list-item]
