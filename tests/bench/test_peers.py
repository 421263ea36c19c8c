"""bench/peers.py's ratios: every Tide case of a round and shape over every peer's."""

from __future__ import annotations

import pytest

from bench import peers
from bench.peers import ratios


def test_each_tide_case_is_compared_with_each_peer_of_its_round_and_shape() -> None:
    rows = [
        {"round": 1, "shape": "batch", "system": "tide", "publish_msgs_per_s": 200},
        {"round": 1, "shape": "batch", "system": "tide-fuller", "publish_msgs_per_s": 300},
        {"round": 1, "shape": "batch", "system": "redis", "publish_msgs_per_s": 100},
        {"round": 1, "shape": "batch", "system": "nats", "publish_msgs_per_s": 0},
        {"round": 2, "shape": "batch", "system": "redis", "publish_msgs_per_s": 50},
        {"round": 1, "shape": "single", "system": "redis", "publish_msgs_per_s": 10},
        {"round": 1, "shape": "batch", "system": "broken", "publish_msgs_per_s": 1, "error": "x"},
    ]
    assert ratios(rows) == [
        {"round": 1, "shape": "batch", "tide": "tide", "tide_over": "redis", "ratio": 2.0},
        {"round": 1, "shape": "batch", "tide": "tide-fuller", "tide_over": "redis", "ratio": 3.0},
    ]


@pytest.mark.parametrize("given", ["20440", "gateway=", "=12", "gateway=12x", "x" * 60])
def test_a_tide_pid_without_name_and_number_is_refused(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peers.main(["--tide-pid", given])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --tide-pid: give NAME=PID, e.g. gateway=1234 (got '" in err
    assert "x" * 41 not in err  # the input is quoted up to a bounded length


def test_a_tide_pid_is_a_name_and_a_number() -> None:
    assert peers.tide_pid("gateway=1234") == ("gateway", 1234)
