"""Reading the services' Prometheus endpoints (``--metrics-endpoint NAME=HOST:PORT``): the
console's one scraping path, used by the cluster page ("Services") and by the live
charts. One bounded scrape, parsed
with prometheus_client's parser into samples."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from services.console.data.limits import METRICS_MAX_BYTES, METRICS_TIMEOUT_S

# An error message about an endpoint is cut here (a URLError can be long).
MAX_SCRAPE_ERROR_CHARS = 300


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


# sample name (a histogram's NAME_bucket, NAME_sum, NAME_count) -> its samples.
Samples = dict[str, list[Sample]]


class ScrapeError(Exception):
    """The endpoint did not answer a readable page in time; the message says why."""


def scrape(endpoint: str, timeout_s: float = METRICS_TIMEOUT_S) -> Samples:
    """``http://ENDPOINT/metrics`` as sample name -> samples (blocking: run it in the
    threadpool). Raises ScrapeError saying why it could not be read."""
    url = f"http://{endpoint}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            body = answer.read(METRICS_MAX_BYTES + 1)
    except (OSError, urllib.error.URLError) as exc:
        raise ScrapeError(f"cannot scrape {url}: {exc}"[:MAX_SCRAPE_ERROR_CHARS]) from exc
    if len(body) > METRICS_MAX_BYTES:
        raise ScrapeError(f"{url}: its exposition is over {METRICS_MAX_BYTES} bytes; not read")
    try:
        return parse(body.decode("utf-8", "replace"))
    except ValueError as exc:
        raise ScrapeError(
            f"{url}: not a Prometheus text exposition ({exc})"[:MAX_SCRAPE_ERROR_CHARS]
        ) from exc


def parse(text: str) -> Samples:
    """A text exposition as sample name -> samples (raises ValueError when unreadable)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(
                Sample(dict(sample.labels), float(sample.value))
            )
    return samples


def total(samples: Mapping[str, list[Sample]], name: str) -> float | None:
    """The sum of a sample over all its labels; None when the endpoint has none."""
    found = samples.get(name)
    return sum(s.value for s in found) if found else None
