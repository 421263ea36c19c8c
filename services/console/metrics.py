"""Reading the services' Prometheus endpoints (``--metrics-endpoint NAME=HOST:PORT``):
one bounded scrape, parsed into samples. The cluster page reads a storage's disk usage,
writability and replication lag there (the gateway's cluster API does not carry them)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 2.0
# A scrape larger than this is refused (a service's page is tens of KiB).
MAX_SCRAPE_BYTES = 4 << 20


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


class ScrapeError(Exception):
    """The endpoint did not answer a readable page in time; the message says why."""


def scrape(endpoint: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> dict[str, list[Sample]]:
    """``http://ENDPOINT/metrics`` as sample name -> samples (blocking: run it in the
    threadpool)."""
    url = f"http://{endpoint}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            body = answer.read(MAX_SCRAPE_BYTES + 1)
    except (OSError, urllib.error.URLError) as exc:
        raise ScrapeError(f"{url}: {exc}"[:300]) from exc
    if len(body) > MAX_SCRAPE_BYTES:
        raise ScrapeError(f"{url}: over {MAX_SCRAPE_BYTES} bytes")
    samples: dict[str, list[Sample]] = {}
    try:
        for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(
                    Sample(dict(sample.labels), float(sample.value))
                )
    except ValueError as exc:
        raise ScrapeError(f"{url}: not Prometheus text ({exc})"[:300]) from exc
    return samples


def first_value(samples: Mapping[str, list[Sample]], name: str) -> float | None:
    found = samples.get(name)
    return found[0].value if found else None
