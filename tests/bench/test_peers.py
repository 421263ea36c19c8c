"""bench/peers.py's ratios: every Tide case of a round and shape over every peer's."""

from __future__ import annotations

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
