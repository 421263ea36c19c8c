"""``tide bench``: OpenMessaging-Benchmark-style workloads against a Tide gateway.

* :mod:`tide.bench._workload`: workload files (YAML or TOML) and their validation;
* :mod:`tide.bench._load`: the load generator (asyncio producers with prebuilt requests,
  long-polling consumers, a sampler);
* :mod:`tide.bench._procs`: producers and consumers in worker processes
  (``producer_processes`` / ``consumer_processes``), merged into the main one's counts;
* :mod:`tide.bench._run`: a whole run (topics through Admin, warm-up, measurement, drain)
  and the bare gRPC echo baseline (:mod:`tide.bench._echo`);
* :mod:`tide.bench._report`: the table, the JSON document and the PNG plot.

Latencies are HdrHistograms in microseconds (3 significant digits), shown in ms.
"""

from __future__ import annotations

from tide.bench._report import format_baseline, format_run, write_plot
from tide.bench._run import run_baseline, run_workload, with_baseline
from tide.bench._workload import (
    Workload,
    WorkloadError,
    apply_overrides,
    load_workload,
    parse_workload,
    workload_from_mapping,
)

__all__ = [
    "Workload",
    "WorkloadError",
    "apply_overrides",
    "format_baseline",
    "format_run",
    "load_workload",
    "parse_workload",
    "run_baseline",
    "run_workload",
    "with_baseline",
    "workload_from_mapping",
    "write_plot",
]
