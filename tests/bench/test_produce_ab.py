"""``bench.produce_ab``'s commands: target 2 (producers only, the ceiling's chain) and,
with ``consumer``, target 1 (the workload's consumer, chain-consume with its pull size)."""

from __future__ import annotations

from pathlib import Path

from bench.produce_ab import bench_command, ceiling_command
from tide.bench import load_workload


def test_target_2_runs_without_the_consumer_against_the_chain() -> None:
    command = bench_command(31703, consumer=False)
    assert command[-2:] == ["--set", "consumers_per_topic=0"]
    assert "127.0.0.1:31703" in command
    ceiling = ceiling_command(Path("/tmp/out.json"), consumer=False)
    assert ceiling[ceiling.index("--cases") + 1] == "chain"
    assert "--pull-batch-max" not in ceiling


def test_target_1_keeps_the_consumer_and_its_pull_size() -> None:
    command = bench_command(31703, consumer=True)
    assert "consumers_per_topic=0" not in command
    workload = load_workload(command[command.index("run") + 1])
    assert workload.consumers_per_topic >= 1  # the workload's own consumer
    ceiling = ceiling_command(Path("/tmp/out.json"), consumer=True)
    assert ceiling[ceiling.index("--cases") + 1] == "chain-consume"
    assert int(ceiling[ceiling.index("--pull-batch-max") + 1]) == workload.pull_batch_max
