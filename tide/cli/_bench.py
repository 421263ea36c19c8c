"""``tide bench run|baseline|list``: OpenMessaging-Benchmark-style workloads (``tide.bench``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import grpc

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    client_tls,
    gateway_parent,
    guarded,
)
from tide.cli._output import dumps, table

WORKLOAD_DIR = Path("bench") / "workloads"

_RUN_DESCRIPTION = """\
Run WORKLOAD (a YAML or TOML file, or the name of one in ./bench/workloads) against the
gateway: create its topics on every master broker, start the consumers (long polling from
the end of every queue), then the producers; warm up, measure, stop the producers, wait
until the consumers have every message, delete the topics. Prints publish and consume
rates, backlog, publish (call) and end-to-end latency percentiles (HdrHistogram), or the
whole report as JSON with --json. --baseline first measures a bare gRPC echo with the same
message shape on this machine and reports Tide's publish rate as a ratio of it.
--producer-processes / --consumer-processes N run the producers / consumers in N OS
processes (the load generator's own CPU is then no limit); the report merges them.
--produce-api stream sends each producer's batches on one ProduceStream (pipelined)
instead of a Produce call per batch. Exit 1
when a call failed or published != consumed."""

_BASELINE_DESCRIPTION = """\
Measure what Python gRPC itself carries on this machine with WORKLOAD's message shape:
its producers (in-flight calls, batch and message size; no rate limit) against a bare
echo of tide.v1.Gateway/Produce started on 127.0.0.1 (no routing, no storage)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = subparsers.add_parser("bench", help="benchmark workloads against a gateway")
    commands = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)

    run = commands.add_parser(
        "run",
        parents=[gateway_parent()],
        help="run a workload and report rates and latencies",
        description=_RUN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _workload_arguments(run)
    run.add_argument("--plot", type=Path, metavar="OUT.png", help="write a PNG plot")
    run.add_argument(
        "--baseline", action="store_true", help="measure the bare gRPC echo first; add the ratio"
    )
    run.add_argument(
        "--baseline-duration-s",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="how long the baseline measures (default 5)",
    )
    run.add_argument("--keep-topics", action="store_true", help="do not delete the topics")
    run.set_defaults(handler=guarded(_rpc_errors(_run)))

    baseline = commands.add_parser(
        "baseline",
        help="a bare gRPC echo of the workload's message shape",
        description=_BASELINE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _workload_arguments(baseline)
    baseline.add_argument("--json", action="store_true", help="print JSON instead of a table")
    baseline.add_argument(
        "--duration-s", type=_seconds, default=5.0, metavar="S", help="measured (default 5)"
    )
    baseline.set_defaults(handler=guarded(_rpc_errors(_baseline)), gateway="")

    listing = commands.add_parser("list", help="the workload files of a directory")
    listing.add_argument("--dir", type=Path, default=WORKLOAD_DIR, help=f"default ./{WORKLOAD_DIR}")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=guarded(_list), gateway="")


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", metavar="WORKLOAD", help="a workload file or name")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="FIELD=VALUE",
        help="override a workload field, e.g. --set duration_s=10 (repeatable)",
    )
    parser.add_argument(
        "--producer-processes",
        type=int,
        metavar="N",
        help="run the producers in N OS processes, each with its share of the producers "
        "and of the rate (1..16; default: the workload's producer_processes, 1)",
    )
    parser.add_argument(
        "--consumer-processes",
        type=int,
        metavar="N",
        help="run the consumers in N OS processes, each with its share of the consumers "
        "(1..16; default: the workload's consumer_processes, 1)",
    )
    parser.add_argument(
        "--produce-api",
        choices=("unary", "stream"),
        help="how producers send: a Produce call per batch (unary) or the batches on one "
        "ProduceStream per producer, inflight requests in flight on it (stream); default: "
        "the workload's produce_api, unary",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _progress(args: argparse.Namespace) -> Any:
    if args.quiet:
        return None
    return lambda text: print(f"tide bench: {text}", file=sys.stderr, flush=True)


def _load(args: argparse.Namespace) -> Any:
    from tide.bench import WorkloadError, apply_overrides, load_workload

    try:
        workload = apply_overrides(load_workload(args.workload, WORKLOAD_DIR), args.overrides)
        for name in ("producer_processes", "consumer_processes", "produce_api"):
            if getattr(args, name) is not None:
                workload = workload.replace(**{name: getattr(args, name)})
        return workload
    except WorkloadError as exc:
        print(f"tide bench: error: {exc}", file=sys.stderr)
        return None


def _rpc_errors(handler: Any) -> Any:
    """A gRPC error outside the counted ones (a consumer cannot read its queue's offsets)
    or an echo server that did not start: one line, exit 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
        except grpc.RpcError as exc:
            code_name = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "RPC"
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            print(f"tide bench: error: {code_name}: {details}", file=sys.stderr)
            return EXIT_FAILURE
        except RuntimeError as exc:
            print(f"tide bench: error: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        return code

    return run


def _run(args: argparse.Namespace) -> int:
    from tide.bench import format_run, run_baseline, run_workload, with_baseline, write_plot

    workload = _load(args)
    if workload is None:
        return EXIT_USAGE
    if args.plot is not None and not _have_matplotlib():
        return EXIT_USAGE
    progress = _progress(args)
    baseline = None
    if args.baseline:
        baseline = run_baseline(workload, duration_s=args.baseline_duration_s, progress=progress)
    report = run_workload(
        workload,
        args.gateway,
        keep_topics=args.keep_topics,
        progress=progress,
        tls=client_tls(args),
    )
    if baseline is not None:
        report = with_baseline(report, baseline)
    if args.plot is not None:
        write_plot(report, args.plot)
        if progress:
            progress(f"wrote {args.plot}")
    print(dumps(report) if args.json else format_run(report))
    return EXIT_OK if report["ok"] else EXIT_FAILURE


def _baseline(args: argparse.Namespace) -> int:
    from tide.bench import format_baseline, run_baseline

    workload = _load(args)
    if workload is None:
        return EXIT_USAGE
    report = run_baseline(workload, duration_s=args.duration_s, progress=_progress(args))
    print(dumps(report) if args.json else format_baseline(report))
    return EXIT_OK if report["errors"] == 0 else EXIT_FAILURE


def _list(args: argparse.Namespace) -> int:
    from tide.bench import WorkloadError, load_workload
    from tide.bench._workload import WORKLOAD_SUFFIXES

    rows = []
    failed = False
    paths = sorted(p for p in args.dir.glob("*") if p.suffix.lower() in WORKLOAD_SUFFIXES)
    for path in paths:
        try:
            workload = load_workload(str(path))
        except WorkloadError as exc:
            print(f"tide bench: error: {exc}", file=sys.stderr)
            failed = True
            continue
        rows.append((path, workload))
    if args.json:
        print(dumps([{"path": str(path), **w.to_dict()} for path, w in rows]))
    else:
        print(table(["WORKLOAD", "DESCRIPTION"], [[w.name, w.summary()] for _, w in rows]))
    return EXIT_FAILURE if failed else EXIT_OK


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            "tide bench: error: --plot needs matplotlib: pip install 'tide[bench]'",
            file=sys.stderr,
        )
        return False
    return True
