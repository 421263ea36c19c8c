"""Resending dead letters to their original topics as background jobs: one job per
request, its progress (done / total / failed / skipped) polled by the page, at most
RESEND_CONCURRENCY sends of a job at once.

Idempotent per message: a dead letter is sent again only when its original topic holds
no copy with its UNIQ_KEY stored after it was dead-lettered (a query by unique key on
the key index), so resending the same selection twice skips what the first resend
wrote and says so (``skipped``). The index follows the commitlog within milliseconds:
two resends of one message that close together can both send; the copy keeps the
dead letter's UNIQ_KEY, so consumers that dedupe by it see one message. The dead
letters stay in ``%DLQ%<group>`` (docs/delivery.md).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from services.console.data.dead_letters import find
from services.console.data.limits import (
    RESEND_CONCURRENCY,
    RESEND_MAX_JOBS,
    RESEND_MAX_MESSAGES,
)
from tide.client import (
    Admin,
    NotFound,
    Producer,
    ReceivedMessage,
    ResourceExhausted,
    TideError,
    TopicNotFound,
)
from tide.dead_letters import dead_letters, original_topic, resent_message

# Errors a job keeps for the page (the first ones: the rest are counted in ``failed``).
MAX_ERRORS_KEPT = 20
ERROR_MAX_CHARS = 300


@dataclass(frozen=True)
class Progress:
    job_id: str
    group: str
    total: int
    done: int
    failed: int
    # Already resent (a copy with its UNIQ_KEY is in the original topic): not sent again.
    skipped: int
    finished: bool
    errors: tuple[str, ...]

    @property
    def handled(self) -> int:
        """Dead letters dealt with so far (sent, skipped or failed)."""
        return self.done + self.skipped + self.failed


class _Job:
    def __init__(self, job_id: str, owner: str, group: str) -> None:
        self.job_id, self.owner, self.group = job_id, owner, group
        self.lock = threading.Lock()
        self.total = self.done = self.failed = self.skipped = 0
        self.finished = False
        self.errors: list[str] = []

    def fail(self, what: str) -> None:
        with self.lock:
            self.failed += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(what[:ERROR_MAX_CHARS])

    def progress(self) -> Progress:
        with self.lock:
            return Progress(
                self.job_id,
                self.group,
                self.total,
                self.done,
                self.failed,
                self.skipped,
                self.finished,
                tuple(self.errors),
            )


class ResendJobs:
    """The resend jobs of one console process (its memory only: a job's progress is
    asked of the process that runs it). At most RESEND_MAX_JOBS are kept: the oldest
    finished one is forgotten for a new one; none is started while that many run."""

    def __init__(
        self, *, max_jobs: int = RESEND_MAX_JOBS, concurrency: int = RESEND_CONCURRENCY
    ) -> None:
        self._max_jobs, self._concurrency = max_jobs, concurrency
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def start(
        self,
        owner: str,
        group: str,
        msg_ids: Sequence[str],
        open_admin: Callable[[], Admin],
        open_producer: Callable[[], Producer],
    ) -> str:
        """Start resending ``msg_ids`` of ``group``'s dead letters (every one, up to
        RESEND_MAX_MESSAGES, when empty); the job id. The job opens its own clients (it
        outlives the request) and closes them when done; ``owner`` (the user) is the
        only one who can read its progress."""
        if len(msg_ids) > RESEND_MAX_MESSAGES:
            raise ResourceExhausted(
                f"{len(msg_ids)} dead letters selected; resend at most {RESEND_MAX_MESSAGES} "
                "at once"
            )
        job = _Job(secrets.token_urlsafe(16), owner, group)
        with self._lock:
            self._make_room()
            self._jobs[job.job_id] = job
        thread = threading.Thread(
            target=self._run,
            args=(job, list(dict.fromkeys(msg_ids)), open_admin, open_producer),
            name=f"console-resend-{job.job_id[:8]}",
            daemon=True,
        )
        thread.start()
        return job.job_id

    def progress(self, owner: str, job_id: str) -> Progress:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or job.owner != owner:
            raise NotFound(
                "no such resend job in this console process (it may have been forgotten: "
                f"a process keeps {self._max_jobs}); list the dead letters again"
            )
        return job.progress()

    def _make_room(self) -> None:
        if len(self._jobs) < self._max_jobs:
            return
        for job_id, job in self._jobs.items():
            if job.finished:
                del self._jobs[job_id]
                return
        raise ResourceExhausted(
            f"{self._max_jobs} resend jobs are running in this console; wait for one to end"
        )

    def _run(
        self,
        job: _Job,
        msg_ids: list[str],
        open_admin: Callable[[], Admin],
        open_producer: Callable[[], Producer],
    ) -> None:
        try:
            with open_admin() as admin, open_producer() as producer:
                letters = _selected(admin, job, msg_ids)
                with job.lock:
                    job.total = len(letters)
                with ThreadPoolExecutor(self._concurrency, "console-resend-send") as pool:
                    for letter in letters:
                        pool.submit(_resend_one, admin, producer, job, letter)
        except TideError as exc:
            job.fail(f"the job stopped: {exc}")
        finally:
            with job.lock:
                job.finished = True


def _selected(admin: Admin, job: _Job, msg_ids: list[str]) -> list[ReceivedMessage]:
    if not msg_ids:
        return list(dead_letters(admin, job.group, RESEND_MAX_MESSAGES))
    letters = []
    for msg_id in msg_ids:
        try:
            letters.append(find(admin, job.group, msg_id))
        except TideError as exc:
            job.fail(f"{msg_id[:64]}: {exc}")
    return letters


def already_resent(admin: Admin, letter: ReceivedMessage, topic: str) -> bool:
    """True when ``topic`` holds a copy with the dead letter's UNIQ_KEY stored after it."""
    if not letter.unique_key:
        return False
    try:
        copies = admin.query_unique_key(topic, letter.unique_key)
    except (TopicNotFound, NotFound):
        return False
    return any(c.store_timestamp_ms >= letter.store_timestamp_ms for c in copies)


def _resend_one(admin: Admin, producer: Producer, job: _Job, letter: ReceivedMessage) -> None:
    topic = original_topic(letter)
    try:
        if not topic:
            raise TideError("it names no original topic (DLQ_ORIGIN_TOPIC)")
        if already_resent(admin, letter, topic):
            with job.lock:
                job.skipped += 1
            return
        result = producer.send_batch([resent_message(letter, topic)])[0]
        if not result.written:
            raise TideError(result.error)
    # A job thread: every failure is counted and shown, none lost with the thread.
    except Exception as exc:
        job.fail(f"{letter.msg_id}: {exc}")
    else:
        with job.lock:
            job.done += 1
