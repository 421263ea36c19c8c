"""The files of a store root: lock, abort, checkpoint and the queue offset snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.storage.engine.errors import CorruptStoreError, NotWritableError, StoreLockedError
from services.storage.engine.message_store import MessageStore
from tests.services.storage.engine.conftest import (
    LOW_DISK_USAGE,
    MAX_BODY_BYTES,
    SEGMENT_BYTES,
    StoreFactory,
    make_config,
    msg,
    read_records,
)
from tide.format import Checkpoint

REPO_ROOT = Path(__file__).resolve().parents[4]
SYSFLAG_PREPARED = 1 << 2
# Opens the store given as argv[1]; exit 3 with the error text if it is locked.
OPEN_SCRIPT = f"""
import sys
from pathlib import Path
from services.storage.engine.config import StoreConfig
from services.storage.engine.errors import CorruptStoreError, NotWritableError, StoreLockedError
from services.storage.engine.message_store import MessageStore
from services.storage.engine.message_codec import MessageInput

store = MessageStore(StoreConfig(
    store_dir=Path(sys.argv[1]),
    segment_size_bytes={SEGMENT_BYTES},
    max_message_body_bytes={MAX_BODY_BYTES},
))
try:
    store.open()
except StoreLockedError as exc:
    print(f"{{type(exc).__name__}}: {{exc}}")
    sys.exit(3)
if sys.argv[2] == "crash":
    store.put([MessageInput(topic="T", queue_id=0, body=b"from the child")])
    import os
    os._exit(0)  # no close(): the abort file stays behind
store.close()
print("opened and closed")
"""


def run_child(store_dir: Path, mode: str = "close") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-c", OPEN_SCRIPT, str(store_dir), mode],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_second_store_in_the_same_process_is_refused(
    make_store: StoreFactory, store_dir: Path
) -> None:
    store = make_store()
    store.put([msg()])
    with pytest.raises(StoreLockedError, match=rf"in use by another process \(pid {os.getpid()}\)"):
        make_store()
    # The first store is unharmed.
    assert store.put([msg()]).batch.positions[0][2] == 1
    assert (store_dir / "abort").exists()
    store.close()
    # Released by close: the directory can be opened again.
    again = make_store()
    assert [r.queue_offset for r in read_records(again)] == [0, 1]


def test_second_process_fails_at_once_naming_the_pid(
    make_store: StoreFactory, store_dir: Path
) -> None:
    store = make_store()
    started = time.monotonic()
    child = run_child(store_dir)
    elapsed = time.monotonic() - started
    assert child.returncode == 3, (child.stdout, child.stderr)
    assert f"StoreLockedError: store {store_dir} is in use by another process" in child.stdout
    assert f"(pid {os.getpid()})" in child.stdout
    assert elapsed < 30, "the second process waited for the lock instead of failing"
    assert store.put([msg()]).batch.positions  # still ours
    store.close()
    child = run_child(store_dir)
    assert child.returncode == 0, (child.stdout, child.stderr)
    assert "opened and closed" in child.stdout


def test_put_after_close_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    store.put([msg()])
    store.close()
    with pytest.raises(NotWritableError, match=r"not open"):
        store.put([msg()])
    store.close()  # a second close is harmless


def test_lock_file_holds_the_owner_pid(make_store: StoreFactory, store_dir: Path) -> None:
    make_store()
    assert (store_dir / "lock").read_text().strip() == str(os.getpid())


def test_abort_file_exists_only_while_open(make_store: StoreFactory, store_dir: Path) -> None:
    assert not (store_dir / "abort").exists()
    store = make_store()
    assert (store_dir / "abort").exists()
    store.put([msg()])
    store.close()
    assert not (store_dir / "abort").exists()
    reopened = make_store()
    assert reopened.recovery is not None
    assert reopened.recovery.mode == "normal"


def test_abort_file_left_by_a_dead_process(make_store: StoreFactory, store_dir: Path) -> None:
    child = run_child(store_dir, "crash")
    assert child.returncode == 0, (child.stdout, child.stderr)
    assert (store_dir / "abort").exists()
    store = make_store()  # the lock died with the process
    assert store.recovery is not None
    assert store.recovery.mode == "abnormal"
    assert [r.body for r in read_records(store)] == [b"from the child"]
    assert store.put([msg()]).batch.positions[0][2] == 1


def test_checkpoint_file_is_4_kib(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    store.close()
    data = (store_dir / "checkpoint").read_bytes()
    assert len(data) == 4096  # written at close even with nothing flushed
    assert Checkpoint.unpack(data) == Checkpoint()
    store = make_store()
    stamp = store.put([msg()]).batch.store_timestamp_ms
    store.close()
    data = (store_dir / "checkpoint").read_bytes()
    assert len(data) == 4096
    assert Checkpoint.unpack(data).physic_msg_timestamp_ms == stamp
    assert not any(data[40:])


def test_queue_offsets_snapshot_written_at_close(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    store.put([msg("T", 0), msg("T", 0), msg("T", 1), msg("a-b", 2), msg("%RETRY%g", 0)])
    store.put([msg("T", 0), msg("a-b", 2), msg("T", 3, sys_flag=SYSFLAG_PREPARED)])
    end = store.status().max_offset
    store.close()
    doc = json.loads((store_dir / "queue_offsets.json").read_text())
    assert doc["commitlogOffset"] == end
    assert doc["flushedOffset"] == end
    assert doc["queueOffsets"] == {"T-0": 3, "T-1": 1, "a-b-2": 2, "%RETRY%g-0": 1}
    reopened = make_store()
    assert reopened.recovery is not None
    assert reopened.recovery.snapshot_used
    assert reopened.commitlog.offsets.next_offsets == {
        ("T", 0): 3,
        ("T", 1): 1,
        ("a-b", 2): 2,
        ("%RETRY%g", 0): 1,
    }
    batch = reopened.put([msg("a-b", 2), msg("T", 3)]).batch
    assert [q for _, _, q in batch.positions] == [2, 0]


def test_failed_open_releases_the_lock(store_dir: Path) -> None:
    """An open that fails after taking the lock gives it back."""
    (store_dir / "commitlog").mkdir(parents=True)
    # A segment of the wrong size cannot be mapped: the open fails.
    (store_dir / "commitlog" / "00000000000000000000").write_bytes(b"short")
    config = make_config(store_dir)
    with pytest.raises(CorruptStoreError, match=r"check --segment-size-bytes"):
        MessageStore(config, usage_ratio=lambda: LOW_DISK_USAGE).open()
    (store_dir / "commitlog" / "00000000000000000000").unlink()
    store = MessageStore(config, usage_ratio=lambda: LOW_DISK_USAGE)
    store.open()  # not StoreLockedError
    store.close()
