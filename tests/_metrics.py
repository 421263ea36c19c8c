"""Scraping a service's Prometheus endpoint (``--metrics-listen``) in tests."""

from __future__ import annotations

import re
import urllib.request

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")

# Waits that scrape /metrics poll at most this often (a scrape is not free).
SCRAPE_INTERVAL_S = 0.2


def scrape(address: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample (labels kept as printed)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE_RE.match(line)
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    found = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            found += value
    return found


def families(samples: dict[str, float]) -> set[str]:
    return {key.partition("{")[0] for key in samples}
