"""The compiled run check (``tide.format._ccore.scan_run``) against its Python reference
(``scan_run_python``): on every run the reference accepts, the same columns; on every run
it rejects (damaged bytes, cut records, too many records, bodies over the limit, store
host bits), None, so that ``scan_run`` raises the reference's error. Skipped when the
extension is not built (test_core_selection fails if it should have been)."""

from __future__ import annotations

import random
import re
from dataclasses import astuple

import pytest

from tide.format import (
    HostAddress,
    RecordError,
    RunWriter,
    _core,
    encode_properties,
    pack_host,
    scan_run,
    topic_part,
)
from tide.format._record_run import scan_run_python

pytestmark = pytest.mark.skipif(
    _core.scan_run is None, reason="the compiled core is not built or is off"
)
V4 = pack_host(HostAddress("10.0.0.7", 10911))
V6 = pack_host(HostAddress("2001:db8::1", 10911))
TOPICS = ["T", "TopicTest", "Ü" * 70, "L" * 200]  # (the last two: V2, two-byte length)


def random_run(rnd: random.Random) -> bytes:
    writer = RunWriter(rnd.choice([V4, V4, V6]))
    for _ in range(rnd.randint(1, 20)):
        topic = rnd.choice(TOPICS)
        body = rnd.randbytes(rnd.choice([0, 1, 10, 128, 300]))
        props = encode_properties(rnd.choice([{}, {"TAGS": "a"}, {"KEYS": "k" * 40}]))
        if rnd.random() < 0.3:
            magic, part = topic_part(topic.encode())
            writer.add_many(magic, part, [rnd.randrange(8)], [body], [props], 1_000)
        else:
            flag, sys_flag = rnd.randrange(3), rnd.choice([0, 0, 1 << 2, 2 << 2])
            writer.add(topic, topic.encode(), rnd.randrange(8), body, props, flag, sys_flag, 9)
    return writer.getvalue()


def damage(rnd: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    kind = rnd.randrange(3)
    if kind == 0:
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(out))
            out[at] = rnd.choice([0, 0xFF, 0x20, out[at] ^ 1])
    elif kind == 1:
        del out[rnd.randrange(len(out)) :]
    else:
        out += out[: rnd.randrange(len(out))]
    return bytes(out)


def assert_same(data: bytes, max_body: int, max_records: int) -> None:
    assert _core.scan_run is not None
    compiled = _core.scan_run(data, max_body, max_records)
    try:
        python = scan_run_python(data, max_body, max_records)
    except RecordError as exc:
        assert compiled is None, f"the compiled check accepted what the reference refuses: {exc}"
        with pytest.raises(RecordError, match=re.escape(str(exc))):
            scan_run(data, max_body, max_records)
        return
    assert compiled is not None
    assert compiled == astuple(python)


@pytest.mark.parametrize("seed", range(60))
def test_valid_runs_check_the_same(seed: int) -> None:
    rnd = random.Random(seed)
    assert_same(random_run(rnd), 4 << 20, 100_000)


@pytest.mark.parametrize("seed", range(300))
def test_damaged_runs_are_refused_by_both(seed: int) -> None:
    rnd = random.Random(10_000 + seed)
    data = damage(rnd, random_run(rnd))
    assert_same(data, rnd.choice([4 << 20, 100]), rnd.choice([100_000, 3]))


def test_edge_cases() -> None:
    rnd = random.Random(5)
    data = random_run(rnd)
    for cut in (0, 1, 87, 88, 99, 100, 101):
        assert_same(data[:cut], 4 << 20, 100_000)
    assert_same(data, 0, 100_000)  # only empty bodies pass
    assert_same(data, 4 << 20, 0)
    store_v6 = bytearray(data)
    store_v6[39] |= 1 << 5  # the store host bit: the store's to set
    assert_same(bytes(store_v6), 4 << 20, 100_000)
    empty_topic = RunWriter(V4)
    empty_topic.add_many(*topic_part(b"x"), [0], [b"b"], [b""], 1)
    broken = bytearray(empty_topic.getvalue())
    broken[88 + 1] = 0  # topic length 0 (then one byte too many before the properties)
    assert_same(bytes(broken), 4 << 20, 100_000)


@pytest.mark.parametrize("seed", range(6))
def test_long_runs_check_the_same(seed: int) -> None:
    """Hundreds of records: the compiled scan's record buffer grows past its first 128
    rows (doubling), and its columns repeat the previous row's ints where values repeat
    (runs of one shape) and not elsewhere; a cap or damage near the end refuses it."""
    rnd = random.Random(50_000 + seed)
    data = b"".join(random_run(rnd) for _ in range(rnd.randint(30, 80)))
    assert_same(data, 4 << 20, 100_000)
    writer = RunWriter(V4)
    for index in range(rnd.choice([127, 128, 129, 300])):
        writer.add("T", b"T", index % 4, b"b" * (index // 100), b"", 0, 0, 1)
    same_shape = writer.getvalue()
    assert_same(same_shape, 4 << 20, 100_000)
    assert_same(same_shape, 4 << 20, 128)
    assert_same(damage(rnd, data), 4 << 20, 100_000)
