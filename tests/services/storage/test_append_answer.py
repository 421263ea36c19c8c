"""The answer to an Append of ``records`` (services/storage/append_answer.py): the bytes
the AppendStream sends, written by hand with the compiled core (its packed columns by
``packed_varints``, or its pure-Python twin), are the bytes protobuf writes for the same
``AppendResponse``, field by field and default by default; without the compiled core
they are protobuf's own."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from services.storage import append_answer
from services.storage.append_answer import columns_answer, columns_response
from services.storage.engine.commitlog import AppendBatch
from tide.format import _core
from tide.format._varint import packed_varints_python
from tide.v1 import storage_pb2 as pb

PREFIX = "7F00000100002A9F"


def batch(
    physical: list[int], sizes: list[int], queue_offsets: list[int], store_ms: int
) -> AppendBatch:
    end = physical[-1] + sizes[-1] if physical else 0
    return AppendBatch(store_ms, physical, sizes, queue_offsets, end)


def cases() -> list[tuple[AppendBatch, pb.AppendStatus.ValueType, str, bool]]:
    rng = random.Random(29)
    found: list[tuple[AppendBatch, pb.AppendStatus.ValueType, str, bool]] = [
        (batch([], [], [], 0), pb.PUT_OK, "", False),  # every field at its default
        (batch([0], [1], [0], 0), pb.PUT_OK, PREFIX, False),  # zeros inside a column
        (batch([1 << 40], [230], [-1], 1), pb.FLUSH_DISK_TIMEOUT, PREFIX, True),
        (batch([5, 6], [1, 1], [(1 << 63) - 1, 0], (1 << 63) - 1), pb.PUT_OK, "é", True),
    ]
    for _ in range(60):
        count = rng.randrange(1, 500)
        sizes = [rng.randrange(60, 5_000_000) for _ in range(count)]
        start = rng.randrange(0, 1 << 45)
        physical = [start + sum(sizes[:i]) for i in range(count)]
        queue_offsets = [rng.randrange(0, 1 << rng.choice((7, 20, 40))) for _ in range(count)]
        status = rng.choice([pb.PUT_OK, pb.FLUSH_DISK_TIMEOUT, pb.FLUSH_SLAVE_TIMEOUT])
        store_ms = rng.choice([0, 1_764_300_000_000])
        found.append((batch(physical, sizes, queue_offsets, store_ms), status, PREFIX, False))
    return found


def _packers() -> list[Callable[[Sequence[int]], bytes]]:
    packers: list[Callable[[Sequence[int]], bytes]] = [packed_varints_python]
    if _core.ccore is not None:
        packers.append(_core.ccore.packed_varints)
    return packers


@pytest.mark.parametrize("pack", _packers())
def test_the_hand_written_answer_is_protobufs(
    monkeypatch: pytest.MonkeyPatch, pack: Callable[[Sequence[int]], bytes]
) -> None:
    """With the compiled columns (as the storage runs with its core) and with the
    Python twin's."""
    monkeypatch.setattr(append_answer, "using_extensions", lambda: True)
    monkeypatch.setattr(append_answer, "packed_varints", pack)
    for found in cases():
        assert columns_answer(*found) == columns_response(*found).SerializeToString(), found


def test_without_the_compiled_core_protobuf_writes_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(append_answer, "using_extensions", lambda: False)
    monkeypatch.setattr(append_answer, "packed_varints", None)  # never reached
    for found in cases()[:8]:
        assert columns_answer(*found) == columns_response(*found).SerializeToString()


def test_a_duplicate_answer_says_so() -> None:
    found = batch([100], [230], [7], 1)
    parsed = pb.AppendResponse.FromString(columns_answer(found, pb.PUT_OK, PREFIX, True))
    assert parsed.duplicate and list(parsed.physical_offsets) == [100]
    plain = columns_answer(found, pb.PUT_OK, PREFIX, False)
    assert not pb.AppendResponse.FromString(plain).duplicate
