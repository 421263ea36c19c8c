"""``tide store dump`` / ``tide store verify`` through the real entry point, in a subprocess."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.commitlog._builder import SEGMENT_SIZE, STORE_HOST, StoreBuilder, Written
from tide.cli import main
from tide.format import (
    ABORT_FILE,
    HostAddress,
    Snapshot,
    make_msg_id,
    msg_id_prefix,
    segment_name,
    write_snapshot,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60


def _tide(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _store(tmp_path: Path) -> StoreBuilder:
    builder = StoreBuilder(tmp_path)
    builder.append(
        "TopicA", b"hello", queue_id=2, properties={"TAGS": "tagA", "KEYS": "k1 k2", "X": "y"}
    )
    builder.append("TopicB", b"\xff\xfe binary")
    builder.append_many(5)
    return builder


def _break_crc(builder: StoreBuilder, record: Written) -> None:
    body_pos = record.size - len(record.body) - len(record.topic) - 1 - 2
    builder.damage(record.offset + body_pos, b"X")


# ---- dump


def test_dump_prints_every_field(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    result = _tide("store", "dump", tmp_path)
    assert result.returncode == 0, result.stderr
    lines = _json_lines(result.stdout)
    assert [d["physical_offset"] for d in lines] == [w.offset for w in builder.records]
    first = lines[0]
    assert first == {
        "physical_offset": 0,
        "total_size": builder.records[0].size,
        "magic": "0xDAA320A7",
        "body_crc": first["body_crc"],
        "queue_id": 2,
        "flag": 0,
        "queue_offset": 0,
        "sys_flag": 0,
        "born_timestamp_ms": first["born_timestamp_ms"],
        "born_host": "192.168.1.20:53012",
        "store_timestamp_ms": builder.records[0].store_timestamp_ms,
        "store_host": "10.0.0.7:10911",
        "reconsume_times": 0,
        "prepared_transaction_offset": 0,
        "topic": "TopicA",
        "properties": {"TAGS": "tagA", "KEYS": "k1 k2", "X": "y"},
        "tags": "tagA",
        "keys": ["k1", "k2"],
        "msg_id": make_msg_id(msg_id_prefix(STORE_HOST), 0),
        "body": base64.b64encode(b"hello").decode(),
        "body_utf8": "hello",
    }
    second = lines[1]
    assert base64.b64decode(second["body"]) == b"\xff\xfe binary"
    assert second["body_utf8"] is None
    assert second["tags"] is None and second["keys"] == []


def test_dump_accepts_the_commitlog_dir_itself(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    result = _tide("store", "dump", builder.commitlog)
    assert result.returncode == 0, result.stderr
    assert len(_json_lines(result.stdout)) == len(builder.records)


def test_dump_start_offset_and_limit(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    while builder.pos < SEGMENT_SIZE + 1000:
        builder.append_many(50)
    builder.write()
    offsets = [w.offset for w in builder.records]
    start = offsets[10]
    result = _tide("store", "dump", tmp_path, "--start-offset", str(start), "--limit", "3")
    assert result.returncode == 0, result.stderr
    assert [d["physical_offset"] for d in _json_lines(result.stdout)] == offsets[10:13]
    result = _tide("store", "dump", tmp_path, "--start-offset", segment_name(SEGMENT_SIZE))
    got = [d["physical_offset"] for d in _json_lines(result.stdout)]
    assert got == [o for o in offsets if o >= SEGMENT_SIZE]
    result = _tide("store", "dump", tmp_path, "--start-offset", hex(start), "--limit", "1")
    assert [d["physical_offset"] for d in _json_lines(result.stdout)] == [start]


def test_dump_ipv6_and_v2_topic(tmp_path: Path) -> None:
    store = HostAddress("2001:db8::7", 10911)
    builder = StoreBuilder(tmp_path)
    builder.append("t" * 200, b"v6", born_host=store, store_host=store)
    builder.write()
    (record,) = _json_lines(_tide("store", "dump", tmp_path).stdout)
    assert record["magic"] == "0xDAA320AB"
    assert record["topic"] == "t" * 200
    assert record["store_host"] == "[2001:db8::7]:10911"
    assert record["born_host"] == "[2001:db8::7]:10911"
    assert len(record["msg_id"]) == 56
    assert record["msg_id"] == make_msg_id(msg_id_prefix(store), 0)


def test_dump_into_a_closed_pipe(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path, segment_size=1 << 20)
    builder.append_many(4000)  # far more JSON than a pipe buffer holds
    builder.write()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tide.cli", "store", "dump", str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=TIMEOUT_S) == 0
    assert json.loads(first)["physical_offset"] == 0
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr


def test_dump_stops_with_exit_1_on_corruption(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    _break_crc(builder, builder.records[3])
    result = _tide("store", "dump", tmp_path)
    assert result.returncode == 1
    assert len(_json_lines(result.stdout)) == 3
    assert f"corruption at offset {builder.records[3].offset}" in result.stderr


def test_dump_notes_a_torn_tail(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    last = builder.records[-1]
    builder.damage(last.offset + 30, bytes(last.size - 30))
    result = _tide("store", "dump", tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(_json_lines(result.stdout)) == len(builder.records) - 1
    assert f"torn tail at offset {last.offset}" in result.stderr


# ---- verify


def test_verify_valid_store(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    result = _tide("store", "verify", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "result: OK" in result.stdout
    assert f"records:    {len(builder.records)} " in result.stdout
    assert result.stderr == ""  # no progress bar: stderr is not a TTY


def test_verify_json(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    result = _tide("store", "verify", "--json", tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["valid"] is True
    assert report["records"] == len(builder.records)
    assert report["last_valid_offset"] == builder.records[-1].end
    assert report["segments_checked"] == 2


def test_verify_torn_tail_exits_0(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    last = builder.records[-1]
    builder.damage(last.offset + 30, bytes(last.size - 30))
    result = _tide("store", "verify", tmp_path)
    assert result.returncode == 0, result.stdout
    assert f"note: torn tail at offset {last.offset}" in result.stdout
    report = json.loads(_tide("store", "verify", "--json", tmp_path).stdout)
    assert report["torn_tail"]["offset"] == last.offset


def test_store_root_files_tell_an_interrupted_write_from_corruption(tmp_path: Path) -> None:
    """Zeros at the head of the last batch with valid records after them: after a crash
    (abort file) past the recorded durable offset, the write the crash interrupted; after
    a clean close, corruption. dump and verify decide alike."""
    builder = _store(tmp_path)
    builder.write()
    first_of_batch = builder.records[4]
    builder.damage(first_of_batch.offset, bytes(32))  # glibc's memcpy stores these last
    (tmp_path / ABORT_FILE).touch()
    write_snapshot(tmp_path, Snapshot(first_of_batch.offset, first_of_batch.offset, {}))

    verified = _tide("store", "verify", tmp_path)
    assert verified.returncode == 0, verified.stdout
    assert f"durable offset {first_of_batch.offset}" in verified.stdout
    assert "did not close cleanly" in verified.stdout
    assert f"note: torn tail at offset {first_of_batch.offset}" in verified.stdout
    assert "the write the crash interrupted" in verified.stdout
    report = json.loads(_tide("store", "verify", "--json", tmp_path).stdout)
    assert report["tail_marks"] == {"durable_offset": first_of_batch.offset, "crashed": True}
    dumped = _tide("store", "dump", tmp_path)
    assert dumped.returncode == 0, dumped.stderr
    assert len(_json_lines(dumped.stdout)) == 4
    assert f"torn tail at offset {first_of_batch.offset}" in dumped.stderr

    (tmp_path / ABORT_FILE).unlink()
    verified = _tide("store", "verify", tmp_path)
    assert verified.returncode == 1
    assert f"CORRUPTION at offset {first_of_batch.offset}" in verified.stdout
    assert _tide("store", "dump", tmp_path).returncode == 1


def test_verify_crc_mismatch_exits_1(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    bad = builder.records[3]
    _break_crc(builder, bad)
    result = _tide("store", "verify", tmp_path)
    assert result.returncode == 1
    assert f"CORRUPTION at offset {bad.offset}" in result.stdout
    result = _tide("store", "verify", "--json", tmp_path)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert [f["offset"] for f in report["corruption"]] == [bad.offset]
    assert report["last_valid_offset"] == bad.offset


def test_verify_gap_exits_1(tmp_path: Path) -> None:
    builder = StoreBuilder(tmp_path)
    while builder.pos < 2 * SEGMENT_SIZE + 1000:
        builder.append_many(50)
    builder.write()
    builder.segment_path(SEGMENT_SIZE).unlink()
    result = _tide("store", "verify", tmp_path)
    assert result.returncode == 1
    assert "gap in the segment chain" in result.stderr
    result = _tide("store", "verify", "--json", tmp_path)
    assert result.returncode == 1
    assert json.loads(result.stdout)["layout_error"].startswith("gap")


def test_verify_empty_store_says_no_segments(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    result = _tide("store", "verify", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "segments:   none (no segments in" in result.stdout
    assert "result: OK (empty: no segments)" in result.stdout
    as_json = _tide("store", "verify", "--json", tmp_path)
    assert as_json.returncode == 0
    report = json.loads(as_json.stdout)
    assert report["empty"] is True and report["valid"] is True


def test_dump_empty_store_says_no_segments(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    result = _tide("store", "dump", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "note: no segments in" in result.stderr and "an empty store" in result.stderr


def test_a_store_with_records_is_not_empty(tmp_path: Path) -> None:
    _store(tmp_path).write()
    result = _tide("store", "verify", "--json", tmp_path)
    assert result.returncode == 0
    assert json.loads(result.stdout)["empty"] is False


def test_verify_and_dump_refuse_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    etc_like = tmp_path / "etc"
    etc_like.mkdir()
    (etc_like / "hosts").write_text("127.0.0.1 localhost\n")
    (etc_like / "ssl").mkdir()
    for directory in (empty, etc_like, Path("/etc")):
        for command in (["verify"], ["verify", "--json"], ["dump"]):
            result = _tide("store", *command, directory)
            assert result.returncode == 2, (command, directory, result.stdout)
            assert result.stdout == ""
            assert f"{directory} is not a Tide/RocketMQ store: no commitlog/ directory" in (
                result.stderr
            )
            assert "result: OK" not in result.stdout + result.stderr


def test_verify_progress_bar(tmp_path: Path) -> None:
    builder = _store(tmp_path)
    builder.write()
    result = _tide("store", "verify", "--progress", tmp_path)
    assert result.returncode == 0
    assert "100.0%" in result.stderr and "MB/s" in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert _tide().returncode == 2
    assert _tide("store").returncode == 2
    assert _tide("store", "verify").returncode == 2
    assert _tide("store", "dump", tmp_path, "--limit", "-1").returncode == 2
    missing = _tide("store", "verify", tmp_path / "missing")
    assert missing.returncode == 2
    assert "not a directory" in missing.stderr


def test_main_in_process(tmp_path: Path) -> None:
    assert main(["store", "verify", str(tmp_path / "missing")]) == 2
    assert main(["--help"]) == 0
