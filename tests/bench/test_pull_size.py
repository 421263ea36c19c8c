"""``pull_batch_max``: the load generator's consumer asks for more after a full pull (it is
behind) and goes back to ``pull_batch`` after a short one (pure, no cluster)."""

from __future__ import annotations

import pytest

from tide.bench import Workload, WorkloadError, apply_overrides
from tide.bench._load import next_pull_size
from tide.bench._workload import workload_from_mapping


def test_full_pulls_double_up_to_the_most_and_a_short_one_resets() -> None:
    workload = Workload(name="w", pull_batch=256, pull_batch_max=1024)
    assert next_pull_size(workload, 256, 256) == 512
    assert next_pull_size(workload, 512, 512) == 1024
    assert next_pull_size(workload, 1024, 1024) == 1024  # never past pull_batch_max
    assert next_pull_size(workload, 1024, 1023) == 256  # caught up: back to pull_batch
    assert next_pull_size(workload, 256, 0) == 256  # a long poll that timed out


def test_a_most_that_is_not_a_power_of_two_of_the_first_is_reached() -> None:
    workload = Workload(name="w", pull_batch=100, pull_batch_max=300)
    assert next_pull_size(workload, 100, 100) == 200
    assert next_pull_size(workload, 200, 200) == 300


def test_without_pull_batch_max_every_pull_asks_for_pull_batch() -> None:
    workload = Workload(name="w", pull_batch=64)
    assert workload.pull_batch_max == 0
    assert next_pull_size(workload, 64, 64) == 64
    assert next_pull_size(workload, 64, 3) == 64


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pull_batch_max": 1025}, "pull_batch_max is 1025; give 0..1024"),
        ({"pull_batch_max": -1}, "pull_batch_max is -1; give 0..1024"),
        (
            {"pull_batch": 256, "pull_batch_max": 100},
            "pull_batch_max is 100, below pull_batch (256); give 0 (pull_batch always) or "
            "256..1024",
        ),
    ],
)
def test_bad_pull_batch_max_is_named(changes: dict[str, int], message: str) -> None:
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        workload_from_mapping({"name": "w", **changes})


def test_pull_batch_max_can_be_set_on_the_command_line() -> None:
    changed = apply_overrides(Workload(name="w"), ["pull_batch_max=512"])
    assert changed.pull_batch_max == 512


def test_a_pull_min_above_the_pull_batch_is_refused() -> None:
    Workload(name="w", pull_batch=256, pull_min_messages=256, pull_min_wait_ms=50)
    with pytest.raises(WorkloadError, match=r"pull_min_messages is 257, above pull_batch \(256\)"):
        Workload(name="w", pull_batch=256, pull_min_messages=257)
    with pytest.raises(WorkloadError, match=r"pull_min_wait_ms is 30001; give 0\.\.30000"):
        Workload(name="w", pull_min_wait_ms=30_001)
