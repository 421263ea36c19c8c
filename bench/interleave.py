"""Issue 21's targets 1 and 2 with Tide and the ceiling up at once, the load switched
between them window by window, so the two are measured at the same speed of the box.

Why: ``bench.produce_ab`` starts a fresh cluster, runs it, stops it, then starts the
relays and runs them; on this VM the box's speed moves between such runs (the ceiling
alone spread 132-188 k msgs/s in one series, every Tide process spent 1.4-1.7x the CPU
a message of its fast runs in its slow ones with the same batching), so a ratio of two
runs half a minute apart carries the box's movement as well as Tide's. Here both are up
for the whole series: one ``tide up --flush async`` cluster and one set of
``bench.hop_ceiling`` relays, and each pair of windows is a ``tide bench run`` against
the cluster and the ceiling's client (``bench.hop_ceiling --address``) against the
relays, back to back, the order reversed every other pair (ABBA: a drift of the box
favours neither). A pair's ratio is Tide's publish rate over the ceiling's; the summary
gives every pair's and their median.

The CPU of every server process is sampled from ``/proc`` every
:data:`SAMPLE_INTERVAL_S` all along, and each window's CPU is taken exactly over that
window (both load generators report its bounds on the system's monotonic clock,
``window_monotonic_s``), per message published in it: target 4's table for both sides
measured the same way. The idle side's CPU during the other's window is reported too
(``idle_core_share``: what it takes from the running side).

    python -m bench.interleave --pairs 10              # target 2 (producers only) and 4
    python -m bench.interleave --pairs 10 --consumer   # target 1 (consumer keeping up)
    python -m bench.interleave --pairs 10 --single     # target 3, unpaced
    python -m bench.interleave --pairs 10 --single --rate 100   # target 3, paced

``--single`` is target 3's shape: single 1 KiB messages, one a request, 4 requests in
flight on one stream, a consumer keeping up (``tide bench``'s ``single-message-1k`` and
the ceiling's chain-consume with ``--batch 1 --message-size 1024``, pulls of up to the
workload's ``pull_batch``). Unpaced, a pair meets target 3 at 0.7x; with ``--rate`` both
producers are paced to the same rate and a pair meets it when Tide's produce p99 is
within 1.5x the ceiling's and its end-to-end p99 within 2x.

With ``--ceiling-stores`` the ceiling's storage relay also writes what it appends to
memory-mapped files, made durable as Tide's ``--flush async`` does (``bench.hop_ceiling
--storage-writes``): the ceiling of a chain that stores.

What it showed here (docs/benchmarks.md "Tide and the ceiling up at once"): pairs back
to back still spread, as each side's CPU a message moves by itself within minutes, so the
figure to quote is a series' median, not a pair.

With ``--versions OLD=DIR --versions NEW=DIR`` the two sides are two versions of Tide's
code instead, each its own ``tide up`` cluster (the services import the version's code:
``PYTHONPATH``, as ``bench.produce_ab``), up at once, their windows in ABBA order the
same way: the A/B of a change measured at the same speed of the box. A pair's ratio is
then the second version's rate over the first's, and its CPU ratios the second's over
the first's, process by process; no target applies. One series does not resolve a
change of a few percent: each cluster carries an effect of its own for its lifetime
that the ABBA windows do not average out (the same code on both sides gave 0.960x and
0.979x; swapping two versions moved a median by 8-17 %: docs/performance.md "Tried, not
kept: single messages behind coalesced calls of single messages"), so run several
series on fresh clusters, in both orders, with an A/A (one directory twice under two
names) beside them.

    python -m bench.interleave --pairs 8 --consumer --versions old=/tmp/old --versions new=.
    python -m bench.interleave --pairs 8 --consumer --versions new=. --versions old=/tmp/old
    python -m bench.interleave --pairs 8 --consumer --versions a=/tmp/old --versions b=/tmp/old

One JSON line per window on stdout, then one ``summary`` line. Each Tide window is a run
of its own (a fresh topic, its consumer from the queues' ends, the topic deleted after);
the relays' consumer starts at their chunks' end too (``bench.hop_ceiling``'s newest-
chunk pull), so neither reads the earlier windows' messages.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import hop_ceiling
from bench.produce_ab import (
    REPO,
    RUN_TIMEOUT_S,
    WORKLOAD,
    bench_command,
    ceiling_args,
    cluster,
    loadavg,
)
from tide.bench import load_workload
from tide.bench._run import process_cpu_s

SAMPLE_INTERVAL_S = 0.05  # /proc's CPU counts tick at 10 ms: 5 ticks between samples
# 2 h of samples kept: each window is read right after it ran (at most 660 s), so a
# longer series can drop its oldest
MAX_SAMPLES = int(2 * 3600 / SAMPLE_INTERVAL_S)
# the next sample is due within an interval; a loaded box can hold the sampler's thread
# back for a while, and one that stopped is an error
SAMPLE_WAIT_BOUND_S = 10.0
STDERR_QUOTED_CHARS = 2000  # of a failed load generator's stderr, in the error
TARGET_RATIO = 0.8  # targets 1 and 2: Tide's publish rate >= 0.8x the ceiling's
TARGET_E2E_P99_MS = 250.0  # target 1: the consumer keeps up, end-to-end p99 within this
SINGLE_TARGET_RATIO = 0.7  # target 3 unpaced: Tide's publish rate >= 0.7x the ceiling's
SINGLE_PRODUCE_P99_RATIO = 1.5  # target 3 paced: Tide's produce p99 <= 1.5x the ceiling's
SINGLE_E2E_P99_RATIO = 2.0  # ... and its end-to-end p99 <= 2x the ceiling's
SINGLE_WORKLOAD = REPO / "bench" / "workloads" / "single-message-1k.yaml"
SINGLE_INFLIGHT = 4  # target 3: 4 requests in flight
TARGET_CPU_RATIO = 1.5  # target 4: each process's CPU a message within 1.5x its relay's
# the roles both sides have, each process against the one in its place (the name server
# has no relay); the load generators are "client" on both
PAIRED_ROLES = ("gateway", "storage", "dispatch", "client")
LIMITS: dict[str, tuple[float, float]] = {
    "pairs": (1, 100),
    "warmup_s": (0, 60),
    "duration_s": (0.5, 600),
    # a paced rate both sides carry with single messages (the ceiling ~1-2 k msgs/s here)
    "rate": (0, 100_000),
}


@dataclass(frozen=True)
class Shape:
    """What both load generators send in a series: ``tide bench run``'s workload and
    ``--set`` options, and ``bench.hop_ceiling``'s options for the same shape (they also
    start the relays it needs)."""

    consumer: bool
    single: bool
    rate: float  # msgs/s for both producers; 0: unpaced
    workload: Path
    tide_sets: tuple[str, ...]
    ceiling: tuple[str, ...]


def shape(args: argparse.Namespace) -> Shape:
    """The series' shape: targets 2 (producers only), 1 (``--consumer``) or 3
    (``--single``, with a consumer; ``--rate`` paces both sides)."""
    if not args.single:
        ceiling = ceiling_args(consumer=args.consumer)
        return Shape(args.consumer, False, 0.0, WORKLOAD, (), tuple(ceiling))
    pull_batch = load_workload(str(SINGLE_WORKLOAD)).pull_batch
    rate = f"{args.rate:g}"
    ceiling = [
        "--cases", "chain-consume", "--batch", "1", "--message-size", "1024",
        "--inflight", str(SINGLE_INFLIGHT), "--pull-batch", str(pull_batch), "--rate", rate,
    ]  # fmt: skip
    sets = (f"inflight={SINGLE_INFLIGHT}", f"rate={rate}")
    return Shape(True, True, float(args.rate), SINGLE_WORKLOAD, sets, tuple(ceiling))


class CpuSampler:
    """Every process's CPU seconds (``/proc``), sampled every ``interval_s`` in a thread,
    at most ``max_samples`` kept; :meth:`between` interpolates two instants."""

    def __init__(
        self,
        pids: dict[str, int],
        interval_s: float = SAMPLE_INTERVAL_S,
        max_samples: int = MAX_SAMPLES,
        wait_bound_s: float = SAMPLE_WAIT_BOUND_S,
    ) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.wait_bound_s = wait_bound_s
        self.times: deque[float] = deque(maxlen=max_samples)
        self.values: deque[dict[str, float]] = deque(maxlen=max_samples)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._lock = threading.Lock()

    def __enter__(self) -> CpuSampler:
        self.take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> None:
        """One sample now."""
        now = time.monotonic()
        values = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        with self._lock:
            self.times.append(now)
            self.values.append(values)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.take()

    def at(self, name: str, instant: float) -> float:
        """``name``'s CPU seconds at ``instant``, linear between the samples around it."""
        with self._lock:
            times, values = list(self.times), list(self.values)
        if not times or not times[0] <= instant <= times[-1]:
            raise ValueError(f"{instant:.3f} is outside the samples ({len(times)} of them)")
        right = bisect.bisect_left(times, instant)
        if times[right] == instant:
            return values[right][name]
        left = right - 1
        share = (instant - times[left]) / (times[right] - times[left])
        return values[left][name] + share * (values[right][name] - values[left][name])

    def between(self, name: str, start: float, end: float) -> float:
        """``name``'s CPU seconds from ``start`` to ``end`` (both sampled past first)."""
        self.wait_past(end)
        return self.at(name, end) - self.at(name, start)

    def wait_past(self, instant: float) -> None:
        """Until a sample later than ``instant`` is in (at most ``wait_bound_s``)."""
        deadline = time.monotonic() + self.wait_bound_s
        while True:
            with self._lock:
                if self.times and self.times[-1] >= instant:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no CPU sample after {instant:.3f}: the sampler stopped")
            time.sleep(self.interval_s / 2)


@dataclass(frozen=True)
class Window:
    """One side's measured window: when, what it published, its e2e p99 (with a
    consumer) and the load generator's CPU in it."""

    system: str  # the side: "tide" or "ceiling", or a version's name
    start: float
    end: float
    published: int
    e2e_p99_ms: float | None
    client_cpu_s: float
    produce_p99_ms: float | None  # a request's, sent to answered

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def rate(self) -> float:
        return self.published / self.seconds


def tide_window(gateway_port: int, args: argparse.Namespace, side: str = "tide") -> Window:
    """A ``tide bench run`` against the cluster of ``side`` (a fresh topic, deleted
    after), in the series' shape."""
    form = shape(args)
    command = bench_command(
        gateway_port, consumer=form.consumer, warmup_s=args.warmup_s,
        duration_s=args.duration_s, workload=form.workload, sets=form.tide_sets,
    )  # fmt: skip
    report = json.loads(_run(command, "tide bench run"))
    if not report["ok"]:
        # errors, or the consumer not having everything: no rate worth comparing
        raise RuntimeError(
            f"tide bench run failed: {report['errors']} errors, last {report['last_error']!r}"
        )
    start, end = report["window_monotonic_s"]
    e2e = report["e2e_latency_ms"]["p99"] if form.consumer else None
    return Window(
        side, start, end, report["publish"]["messages"], e2e, report["client_cpu"]["cpu_s"],
        report["publish_latency_ms"]["p99"],
    )  # fmt: skip


def ceiling_window(address: str, args: argparse.Namespace) -> Window:
    """``bench.hop_ceiling``'s client alone against the relays at ``address``."""
    form = shape(args)
    with tempfile.TemporaryDirectory() as out:
        path = Path(out) / "ceiling.json"
        command = [
            sys.executable, "-m", "bench.hop_ceiling", *form.ceiling,
            "--address", address, "--warmup-s", f"{args.warmup_s:g}",
            "--duration-s", f"{args.duration_s:g}", "--json-out", str(path),
        ]  # fmt: skip
        _run(command, "bench.hop_ceiling")
        (result,) = json.loads(path.read_text())["results"]
    start, end = result["window_monotonic_s"]
    e2e = result["e2e_p99_ms"] if form.consumer else None
    return Window(
        "ceiling", start, end, result["published"], e2e, result["client_window_cpu_s"],
        result["call_p99_ms"],
    )  # fmt: skip


def _run(command: list[str], what: str) -> str:
    """``command``'s stdout; its stderr's end in the error if it failed."""
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        tail = done.stderr[-STDERR_QUOTED_CHARS:]
        raise RuntimeError(f"{what} exited with {done.returncode}: {tail}")
    return done.stdout


def window_row(
    pair: int, window: Window, sampler: CpuSampler, own: Sequence[str], idle: Sequence[str]
) -> dict[str, Any]:
    """The window's JSON line: its rate, each of its processes' CPU a message (``own``,
    the load generator's as ``client``) and the idle side's share of a core."""
    if window.published <= 0:
        raise RuntimeError(f"the {window.system} window published nothing: no rate to compare")
    # by role ("tide.storage" -> "storage"): the summary pairs each with its relay
    per_msg = {
        name.split(".", 1)[1]: round(
            sampler.between(name, window.start, window.end) / window.published * 1e6, 3
        )
        for name in own
    }
    per_msg["client"] = round(window.client_cpu_s / window.published * 1e6, 3)
    idle_cpu = sum(sampler.between(name, window.start, window.end) for name in idle)
    row: dict[str, Any] = {
        "pair": pair,
        "system": window.system,
        "publish_msgs_per_s": round(window.rate),
        "window_s": round(window.seconds, 3),
        "cpu_us_per_msg": per_msg,
        "idle_core_share": round(idle_cpu / window.seconds, 4),
        "load": loadavg(),
    }
    if window.produce_p99_ms is not None:
        row["produce_p99_ms"] = window.produce_p99_ms
    if window.e2e_p99_ms is not None:
        row["e2e_p99_ms"] = window.e2e_p99_ms
    return row


def summary(
    rows: list[dict[str, Any]],
    *,
    consumer: bool,
    sides: tuple[str, str] = ("tide", "ceiling"),
    targets: bool = True,
    single: bool = False,
    paced: bool = False,
) -> dict[str, Any]:
    """Each pair's ratio (the first side's rate over the second's: Tide's over the
    ceiling's, or the new version's over the old's), their median, each process's CPU
    ratio pair by pair and, with ``targets``, how many pairs met issue 21's: targets 1
    and 2, or with ``single`` target 3 (unpaced: the rate; ``paced``: the p99s)."""
    first, second = sides
    pairs: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        pairs.setdefault(row["pair"], {})[row["system"]] = row
    whole = [pair for _, pair in sorted(pairs.items()) if len(pair) == 2]
    ratios = [p[first]["publish_msgs_per_s"] / p[second]["publish_msgs_per_s"] for p in whole]
    cpu_ratios = {
        role: [p[first]["cpu_us_per_msg"][role] / p[second]["cpu_us_per_msg"][role] for p in whole]
        for role in PAIRED_ROLES
    }
    result: dict[str, Any] = {
        "pairs": len(whole),
        "ratios": [round(ratio, 3) for ratio in ratios],
        "median_ratio": _median(ratios),
        "cpu_ratio_medians": {name: _median(values) for name, values in cpu_ratios.items()},
    }
    p99_ratios = {
        kind: [p[first][f"{kind}_p99_ms"] / p[second][f"{kind}_p99_ms"] for p in whole]
        for kind in (("produce", "e2e") if consumer else ("produce",))
    }
    for kind, values in p99_ratios.items():
        result[f"{kind}_p99_ratios"] = [round(value, 3) for value in values]
        result[f"{kind}_p99_ratio_median"] = _median(values)
    if targets:
        result |= _targets(whole, ratios, p99_ratios, first, consumer, single, paced)
        result["cpu_pairs_within_target"] = {
            name: sum(value <= TARGET_CPU_RATIO for value in values)
            for name, values in cpu_ratios.items()
        }
    else:
        result["pairs_ahead"] = sum(ratio > 1 for ratio in ratios)
    if consumer:
        for side in sides:
            result[f"{side}_e2e_p99_ms"] = [p[side]["e2e_p99_ms"] for p in whole]
    return result


def _targets(
    whole: list[dict[str, dict[str, Any]]],
    ratios: list[float],
    p99_ratios: dict[str, list[float]],
    first: str,
    consumer: bool,
    single: bool,
    paced: bool,
) -> dict[str, int]:
    """How many pairs met the series' target (and, paced, each of its two bounds)."""
    if single and paced:
        produce = [value <= SINGLE_PRODUCE_P99_RATIO for value in p99_ratios["produce"]]
        e2e = [value <= SINGLE_E2E_P99_RATIO for value in p99_ratios["e2e"]]
        return {
            "pairs_meeting_target": sum(a and b for a, b in zip(produce, e2e, strict=True)),
            "pairs_meeting_produce_p99": sum(produce),
            "pairs_meeting_e2e_p99": sum(e2e),
        }
    if single:
        return {"pairs_meeting_target": sum(ratio >= SINGLE_TARGET_RATIO for ratio in ratios)}
    met = [ratio >= TARGET_RATIO for ratio in ratios]
    if consumer:
        met = [
            ok and p[first]["e2e_p99_ms"] <= TARGET_E2E_P99_MS
            for ok, p in zip(met, whole, strict=True)
        ]
    return {"pairs_meeting_target": sum(met)}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


@dataclass(frozen=True)
class Systems:
    """Both sides up: where each side's load generator goes (a Tide gateway's port, or
    the relays' front address), in the order of the first pair's windows, and every
    server's process id (``<side>.<role>``)."""

    fronts: dict[str, int | str]
    pids: dict[str, int]

    def names(self, side: str) -> list[str]:
        """The processes of one side."""
        return [name for name in self.pids if name.startswith(f"{side}.")]


@contextlib.contextmanager
def systems(args: argparse.Namespace, store: Path) -> Iterator[Systems]:
    """Tide's cluster (on ``store``) and the relays of the same shape, or with
    ``--versions`` one cluster of each version (the second's ports 40 above the
    first's), all up at once; stopped on the way out."""
    with contextlib.ExitStack() as stack:
        fronts: dict[str, int | str] = {}
        pids: dict[str, int] = {}
        if args.versions:
            for index, (name, code) in enumerate(args.versions):
                side_store = store / name
                side_store.mkdir()
                tide = stack.enter_context(cluster(code, args.port + 40 * index, side_store))
                fronts[name] = tide.gateway_port
                pids |= {f"{name}.{service}": pid for service, pid in tide.pids.items()}
        else:
            relay_args = hop_ceiling.parse(relays_argv(args))
            tide = stack.enter_context(cluster(REPO, args.port, store))
            relays = stack.enter_context(hop_ceiling.relays(relay_args.cases, relay_args))
            fronts = {"tide": tide.gateway_port, "ceiling": relays[-1].address}
            pids = {f"tide.{name}": pid for name, pid in tide.pids.items()}
            pids |= {f"ceiling.{relay.name}": relay.proc.pid for relay in relays}
        yield Systems(fronts, pids)


def relays_argv(args: argparse.Namespace) -> list[str]:
    """``bench.hop_ceiling``'s options for the relays of the series ``args`` asks for."""
    stores = ["--storage-writes"] if args.ceiling_stores else []
    return [*shape(args).ceiling, *stores]


def window(side: str, front: int | str, args: argparse.Namespace) -> Window:
    """One window of ``side``: a Tide cluster's (its gateway's port) or the relays'."""
    if isinstance(front, int):
        return tide_window(front, args, side)
    return ceiling_window(front, args)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The series: ``args.pairs`` pairs of windows, one JSON line each, then the summary."""
    store = Path(tempfile.mkdtemp(prefix="interleave-"))
    rows: list[dict[str, Any]] = []
    try:
        with systems(args, store) as up, CpuSampler(up.pids) as sampler:
            sides = list(up.fronts)
            for pair in range(args.pairs):
                for side in sides if pair % 2 == 0 else sides[::-1]:
                    measured = window(side, up.fronts[side], args)
                    idle = [name for name in up.pids if not name.startswith(f"{side}.")]
                    row = window_row(pair, measured, sampler, up.names(side), idle)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    form = shape(args)
    compared, targets = ("tide", "ceiling"), True
    if args.versions:
        (old, _), (new, _) = args.versions
        compared, targets = (new, old), False
    result = summary(
        rows, consumer=form.consumer, sides=compared, targets=targets, single=form.single,
        paced=form.rate > 0,
    )  # fmt: skip
    print(json.dumps({"summary": result}), flush=True)
    return rows


def _version(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` of ``--versions``: a name without dots, a directory holding the
    code (tide/ and services/)."""
    name, equals, path = text.partition("=")
    code = Path(path)
    if (
        not (name and equals and path)
        or "." in name
        or not (code / "tide").is_dir()
        or not (code / "services").is_dir()
    ):
        raise argparse.ArgumentTypeError(
            f"{text[:200]!r}: give NAME=DIR, a name without dots and a directory holding "
            "tide/ and services/"
        )
    return name, code.resolve()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="pairs of windows")
    parser.add_argument(
        "--consumer", action="store_true",
        help="target 1: the workload's consumer keeps up; the ceiling's chain-consume",
    )  # fmt: skip
    parser.add_argument("--warmup-s", type=float, default=3.0, help="each window's warm-up")
    parser.add_argument("--duration-s", type=float, default=10.0, help="each window, measured")
    parser.add_argument(
        "--port", type=int, default=32300,
        help="first of 31 ports Tide uses (71 with --versions)",
    )  # fmt: skip
    parser.add_argument(
        "--ceiling-stores", action="store_true",
        help="the ceiling's storage relay writes its appends to files (hop_ceiling's "
        "--storage-writes)",
    )  # fmt: skip
    parser.add_argument(
        "--single", action="store_true",
        help="target 3: single 1 KiB messages, 4 in flight, a consumer keeping up",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=float, default=0.0,
        help="with --single: both producers paced to this many msgs/s (0: unpaced)",
    )  # fmt: skip
    parser.add_argument(
        "--versions", action="append", type=_version, metavar="NAME=DIR",
        help="twice: two versions of Tide's code against each other instead of the ceiling",
    )  # fmt: skip
    args = parser.parse_args(argv)
    hop_ceiling.check_limits(args, LIMITS)
    if args.single and args.consumer:
        parser.error("--single has its consumer already: give one of --single, --consumer")
    if args.rate and not args.single:
        parser.error("--rate paces target 3's shape only: give it with --single")
    if args.versions is not None:
        names = [name for name, _ in args.versions]
        if len(names) != 2 or len(set(names)) != 2:
            parser.error(f"--versions: give exactly two, with different names (got {names})")
    return args


def main(argv: list[str] | None = None) -> int:
    run(parse(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
