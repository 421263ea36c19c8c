"""The compiled run check with the store's rules (``tide.format._ccore.check_run``)
against its Python reference (``check_run_python``): on random, damaged and edge-case
runs, the same columns, the same calls to ``resolve`` (once per topic, in the order met,
with the index of its first record), one key object per queue, and the same verdict
when a rule or a layout check fails. Skipped when the extension is not built."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from tests.format.test_ccore_run import V4, V6, damage
from tide.format import RecordError, RunWriter, _core, check_run, encode_properties
from tide.format._run_check import check_run_python

pytestmark = pytest.mark.skipif(
    _core.check_run is None, reason="the compiled core is not built or is off"
)
TOPICS = ["T", "TopicTest", "Ü" * 70, "L" * 200]  # (the last two: V2, two-byte length)
ALL_FLAGS = 0b111_0011_1111  # (a producer's bits and the born host's)
SYS_FLAGS = [0, 0, 0, 1 << 2, 2 << 2, 3 << 2, 1 << 1]  # none, prepared, commit, rollback, tags
Calls = list[tuple[bytes, int]]


def random_run(rnd: random.Random, queues: int) -> bytes:
    writer = RunWriter(rnd.choice([V4, V4, V6]))
    topics = rnd.sample(TOPICS, rnd.randint(1, len(TOPICS)))
    for _ in range(rnd.randint(1, 30)):
        topic = rnd.choice(topics)
        body = rnd.randbytes(rnd.choice([0, 1, 10, 128]))
        props = encode_properties(rnd.choice([{}, {"TAGS": "a"}]))
        queue_id = rnd.randrange(queues)
        writer.add(topic, topic.encode(), queue_id, body, props, 0, rnd.choice(SYS_FLAGS), 9)
    return writer.getvalue()


def resolver(counts: dict[bytes, int], calls: Calls) -> Callable[[bytes, int], tuple[str, int]]:
    def resolve(name: bytes, index: int) -> tuple[str, int]:
        calls.append((name, index))
        return name.decode(), counts.get(name, 4)

    return resolve


def assert_same(data: bytes, counts: dict[bytes, int], allowed: int) -> None:
    assert _core.check_run is not None
    compiled_calls: Calls = []
    python_calls: Calls = []
    try:
        compiled = _core.check_run(data, 1_000, 1_000, resolver(counts, compiled_calls), allowed)
    except UnicodeDecodeError as exc:  # (resolve's own error, on a damaged topic)
        with pytest.raises(UnicodeDecodeError, match=re.escape(str(exc))):
            check_run_python(data, 1_000, 1_000, resolver(counts, python_calls), allowed)
        assert compiled_calls == python_calls
        return
    try:
        python = check_run_python(data, 1_000, 1_000, resolver(counts, python_calls), allowed)
    except RecordError as exc:
        assert compiled is None, f"the compiled check accepted what the reference refuses: {exc}"
        assert compiled_calls == []  # (a layout failure comes before any topic is resolved)
        with pytest.raises(RecordError, match=re.escape(str(exc))):
            check_run(data, 1_000, 1_000, resolver(counts, []), allowed)
        return
    assert compiled_calls == python_calls
    if python is None:
        assert compiled is False
        assert check_run(data, 1_000, 1_000, resolver(counts, []), allowed) is None
        return
    assert isinstance(compiled, tuple)
    assert compiled == python
    keys = [key for key in compiled[1] if key is not None]
    assert len({id(key) for key in keys}) == len(set(keys))  # one object per queue


@pytest.mark.parametrize("seed", range(80))
def test_random_runs_check_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    queues = rnd.choice([4, 8, 2_000])  # (beyond 1,024: the compiled keys' dict)
    data = random_run(rnd, queues)
    counts = {topic.encode(): rnd.choice([queues, queues, 3, 1_500]) for topic in TOPICS}
    assert_same(data, counts, rnd.choice([ALL_FLAGS, ALL_FLAGS, 0b1_0000, ALL_FLAGS & ~0b10]))


@pytest.mark.parametrize("seed", range(80))
def test_damaged_runs_check_the_same(seed: int) -> None:
    rnd = random.Random(1_000 + seed)
    assert_same(damage(rnd, random_run(rnd, 8)), {}, ALL_FLAGS)


def test_an_empty_run_resolves_nothing() -> None:
    calls: Calls = []
    assert check_run(b"", 1_000, 1_000, resolver({}, calls), ALL_FLAGS) == ([], [], [])
    assert calls == []


def test_a_queue_id_at_the_topics_count_is_refused_by_both() -> None:
    writer = RunWriter(V4)
    writer.add("T", b"T", 3, b"x", b"", 0, 0, 9)
    assert_same(writer.getvalue(), {b"T": 4}, ALL_FLAGS)
    assert check_run(writer.getvalue(), 1_000, 1_000, resolver({b"T": 3}, []), ALL_FLAGS) is None


def test_prepared_and_rollback_records_take_no_key() -> None:
    writer = RunWriter(V4)
    for sys_flag in (0, 1 << 2, 2 << 2, 3 << 2):
        writer.add("T", b"T", 1, b"x", b"", 0, sys_flag, 9)
    checked = check_run(writer.getvalue(), 1_000, 1_000, resolver({}, []), ALL_FLAGS)
    assert checked is not None
    assert checked[1] == [("T", 1), None, ("T", 1), None]


def test_an_error_of_resolve_passes_through_both() -> None:
    writer = RunWriter(V4)
    writer.add("T", b"T", 0, b"x", b"", 0, 0, 9)
    writer.add("U", b"U", 0, b"x", b"", 0, 0, 9)

    def resolve(name: bytes, index: int) -> tuple[str, int]:
        if name == b"U":
            raise LookupError(f"no topic {name!r} (record {index})")
        return name.decode(), 4

    assert _core.check_run is not None
    for check in (_core.check_run, check_run_python):
        with pytest.raises(LookupError, match=re.escape("no topic b'U' (record 1)")):
            check(writer.getvalue(), 1_000, 1_000, resolve, ALL_FLAGS)


@pytest.mark.parametrize("topics", [4, 5, 9, 17])
def test_many_topics_in_one_run_check_the_same(topics: int) -> None:
    """The compiled check's table of topics starts with room for 4 and doubles: a run
    that fills it exactly, and ones that grow it once, twice and three times."""
    writer = RunWriter(V4)
    for index in range(2 * topics):
        topic = f"Topic{index % topics}"
        writer.add(topic, topic.encode(), index % 3, b"body", b"", 0, 0, 9)
    calls: Calls = []
    checked = check_run(writer.getvalue(), 1_000, 1_000, resolver({}, calls), ALL_FLAGS)
    assert checked is not None
    assert [name for name, _ in calls] == [f"Topic{i}".encode() for i in range(topics)]
    assert_same(writer.getvalue(), {}, ALL_FLAGS)
