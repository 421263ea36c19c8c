"""The console's bounds on what one page asks of the cluster (docs/configuration.md,
"Console limits"). Each is one limit, used where it applies."""

from __future__ import annotations

# Messages page: results of one search (by key, unique key or time range).
SEARCH_MAX_RESULTS = 200
# Messages page: queues a time-range search reads (SearchOffset + BrowseQueue each).
SEARCH_MAX_QUEUES = 64
# Messages page: BrowseQueue calls of one time-range search, all queues together.
SEARCH_MAX_BROWSE_CALLS = 64
# Messages page: characters of input quoted back in an error.
QUOTE_MAX_CHARS = 80
# Body preview: the text and JSON views show at most this many bytes of the body.
PREVIEW_TEXT_MAX_BYTES = 64 * 1024
# Body preview: the hex view shows the first this many bytes.
PREVIEW_HEX_MAX_BYTES = 4096
# Trace: consumer groups looked at for one message's deliveries.
TRACE_MAX_GROUPS = 32
# Trace: retry copies listed per group.
TRACE_MAX_RETRY_COPIES = 32
# Dead letters page: dead letters listed on one page.
DLQ_PAGE_MAX = 100
# Dead letters: messages one resend job takes ("all" takes the first this many).
RESEND_MAX_MESSAGES = 10_000
# Dead letters: sends a resend job has unanswered at once.
RESEND_CONCURRENCY = 8
# Dead letters: resend jobs a console process keeps (running and finished; the oldest
# finished one is forgotten first, and a new job is refused while this many run).
RESEND_MAX_JOBS = 16
# Pending page: delayed / timed / half messages listed.
PENDING_MAX_LIST = 200
# Pending page: messages read from the schedule and timer topics' queues to find the
# ones not yet due (the newest this many of each queue).
PENDING_MAX_SCANNED = 2000
# Charts: endpoints scraped at once (the config bounds how many there are).
METRICS_SCRAPE_THREADS = 8
# Charts: bytes read from one endpoint's exposition.
METRICS_MAX_BYTES = 4 * 1024 * 1024
# Charts: seconds one scrape may take.
METRICS_TIMEOUT_S = 2.0
