"""``tide store dump`` and ``tide store verify``: offline tools over a store's commitlog."""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tide.commitlog import (
    CommitlogCorruptionError,
    CommitlogLayoutError,
    NotAStoreError,
    RecordAt,
    TornTail,
    VerifyReport,
    find_commitlog_dir,
    iter_records,
    scan_layout,
    tail_marks_for,
    verify,
)
from tide.format import KEYS, TAGS, HostAddress, make_msg_id, msg_id_prefix

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
MAX_SHOWN_FINDINGS = 20
MAX_PREFIX_CACHE = 1024


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = subparsers.add_parser("store", help="inspect a store directory offline")
    commands = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)
    dump = commands.add_parser(
        "dump", help="print every commitlog record as one JSON line", description=_DUMP_HELP
    )
    _add_dir_argument(dump)
    dump.add_argument("--start-offset", type=_non_negative, metavar="N", help="first offset")
    dump.add_argument("--limit", type=_non_negative, metavar="N", help="print at most N records")
    dump.set_defaults(handler=_run_dump)
    check = commands.add_parser(
        "verify", help="check every commitlog record", description=_VERIFY_HELP
    )
    _add_dir_argument(check)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--progress", action="store_true", help="show a progress bar even if stderr is no TTY"
    )
    check.set_defaults(handler=_run_verify)


_DUMP_HELP = (
    "Print every record of the commitlog as one JSON line, oldest first. A start offset "
    "inside a record starts at the next record. Exit 1 on corruption; exit 2 when DIR is "
    "not a store (no commitlog/ directory and no segment files). A store with no segments "
    "prints nothing and says so on stderr (exit 0)."
)
_VERIFY_HELP = (
    "Check the segment chain and every record (magic, sizes, CRC, physical offset, blank "
    "markers). A torn tail (the end of a crash) is a note; exit 1 on corruption. Given a "
    "store root, its abort file and queue_offsets.json tell what a crash can have left "
    "unfinished (docs/formats.md, 'Torn tails and corruption'). Exit 2 when DIR is not a "
    "store (no commitlog/ directory and no segment files); a store with no segments is "
    "'result: OK (empty: no segments)', exit 0."
)


def _add_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir", type=Path, metavar="DIR", help="store root (holding commitlog/) or commitlog dir"
    )


def _non_negative(text: str) -> int:
    """A decimal (leading zeros allowed, as in segment names) or 0x-prefixed hex integer."""
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _commitlog_dir(args: argparse.Namespace) -> Path | None:
    """The commitlog directory of DIR, or None (after saying why) when DIR is no store:
    a usage error (exit 2), not an empty valid log."""
    try:
        return find_commitlog_dir(args.dir)
    except NotAStoreError as exc:
        print(f"tide store {args.store_command}: {exc}", file=sys.stderr)
        return None


# ---- dump


def _run_dump(args: argparse.Namespace) -> int:
    commitlog_dir = _commitlog_dir(args)
    if commitlog_dir is None:
        return EXIT_USAGE
    try:
        return _dump(commitlog_dir, args.start_offset, args.limit, sys.stdout)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter from
        # failing again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_OK


def _dump(commitlog_dir: Path, start_offset: int | None, limit: int | None, out: TextIO) -> int:
    torn: list[TornTail] = []
    prefixes: dict[HostAddress, str] = {}
    try:
        if not scan_layout(commitlog_dir).segments:
            print(f"note: {_no_segments_text(commitlog_dir)}", file=sys.stderr)
            return EXIT_OK
        marks = tail_marks_for(commitlog_dir)
        records = iter_records(commitlog_dir, start_offset, on_torn_tail=torn.append, marks=marks)
        with contextlib.closing(records):
            for at in itertools.islice(records, limit):
                out.write(json.dumps(record_json(at, prefixes)) + "\n")
    except (CommitlogLayoutError, CommitlogCorruptionError) as exc:
        print(f"tide store dump: {exc}", file=sys.stderr)
        out.flush()
        return EXIT_FAILURE
    out.flush()
    for tail in torn:
        print(f"note: {_torn_text(tail)}", file=sys.stderr)
    return EXIT_OK


def record_json(at: RecordAt, prefixes: dict[HostAddress, str]) -> dict[str, Any]:
    """Every field of a record, JSON-ready (body as base64, plus UTF-8 text when it is)."""
    r = at.record
    prefix = prefixes.get(r.store_host)
    if prefix is None:
        if len(prefixes) >= MAX_PREFIX_CACHE:
            prefixes.clear()
        prefix = prefixes[r.store_host] = msg_id_prefix(r.store_host)
    return {
        "physical_offset": r.physical_offset,
        "total_size": r.total_size,
        "magic": f"0x{r.magic & 0xFFFFFFFF:08X}",
        "body_crc": r.body_crc,
        "queue_id": r.queue_id,
        "flag": r.flag,
        "queue_offset": r.queue_offset,
        "sys_flag": r.sys_flag,
        "born_timestamp_ms": r.born_timestamp_ms,
        "born_host": str(r.born_host),
        "store_timestamp_ms": r.store_timestamp_ms,
        "store_host": str(r.store_host),
        "reconsume_times": r.reconsume_times,
        "prepared_transaction_offset": r.prepared_transaction_offset,
        "topic": r.topic,
        "properties": r.properties,
        "tags": r.properties.get(TAGS),
        "keys": [k for k in r.properties.get(KEYS, "").split(" ") if k],
        "msg_id": make_msg_id(prefix, r.physical_offset),
        "body": base64.b64encode(r.body).decode("ascii"),
        "body_utf8": _utf8_or_none(r.body),
    }


def _utf8_or_none(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# ---- verify


def _run_verify(args: argparse.Namespace) -> int:
    commitlog_dir = _commitlog_dir(args)
    if commitlog_dir is None:
        return EXIT_USAGE
    bar = _ProgressBar(sys.stderr) if args.progress or sys.stderr.isatty() else None
    try:
        report = verify(commitlog_dir, bar, tail_marks_for(commitlog_dir))
    except CommitlogLayoutError as exc:
        if bar is not None:
            bar.finish()
        _print_layout_error(commitlog_dir, exc, as_json=args.json)
        return EXIT_FAILURE
    if bar is not None:
        bar.finish()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_summary(report)
    return EXIT_OK if report.valid else EXIT_FAILURE


def _print_layout_error(commitlog_dir: Path, exc: CommitlogLayoutError, *, as_json: bool) -> None:
    if as_json:
        doc = {"commitlog_dir": str(commitlog_dir), "valid": False, "layout_error": str(exc)}
        print(json.dumps(doc, indent=2))
    print(f"tide store verify: layout error: {exc}", file=sys.stderr)


def _no_segments_text(commitlog_dir: Path | str) -> str:
    return f"no segments in {commitlog_dir}: an empty store (nothing was ever written)"


def _print_summary(report: VerifyReport) -> None:
    print(f"commitlog:  {report.commitlog_dir}")
    if report.empty:
        print(f"segments:   none ({_no_segments_text(report.commitlog_dir)})")
    else:
        print(f"segments:   {report.segments_checked} of {report.segment_size} bytes")
    print(
        f"records:    {report.records} ({report.record_bytes} bytes), "
        f"{report.blank_markers} blank markers"
    )
    if report.first_offset is not None:
        print(f"offsets:    first record {report.first_offset}, last {report.last_offset}")
    marks = report.tail_marks
    closed = "did not close cleanly (abort file)" if marks.crashed else "no abort file"
    print(f"store:      {closed}, durable offset {marks.durable_offset}")
    print(f"valid up to offset {report.last_valid_offset}")
    for warning in report.warnings:
        print(f"warning: {warning}")
    if report.torn_tail is not None:
        print(f"note: {_torn_text(report.torn_tail)}")
    for finding in report.corruption[:MAX_SHOWN_FINDINGS]:
        print(f"CORRUPTION at offset {finding.offset}: {finding.reason}")
    hidden = report.corruption_count - min(len(report.corruption), MAX_SHOWN_FINDINGS)
    if hidden > 0:
        print(f"... and {hidden} more corruption findings (see --json)")
    if report.valid:
        print("result: OK (empty: no segments)" if report.empty else "result: OK")
    else:
        print(f"result: CORRUPT ({report.corruption_count} findings)")


def _torn_text(tail: TornTail) -> str:
    return (
        f"torn tail at offset {tail.offset} ({tail.bytes} bytes: {tail.reason}); "
        "a clean end after a crash, recovery truncates it"
    )


class _ProgressBar:
    """``[#####.....]  42.0%  123.4 MB/s`` on one line, redrawn at most 10 times a second."""

    WIDTH = 30
    INTERVAL_S = 0.1

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.drawn_at = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.drawn_at < self.INTERVAL_S and done < total:
            return
        self.drawn_at = now
        fraction = done / total if total > 0 else 1.0
        filled = int(fraction * self.WIDTH)
        rate = done / max(now - self.started, 1e-6) / 1e6
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {fraction * 100:5.1f}%  {rate:8.1f} MB/s")
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
