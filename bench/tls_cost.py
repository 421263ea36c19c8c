"""TLS, and TLS + authentication, against plaintext in the same run (issue 22;
docs/security.md, docs/benchmarks.md "TLS and authentication").

    python -m bench.tls_cost                             # 6 rounds of 3 x 10 s
    python -m bench.tls_cost --duration-s 3 --rounds 1   # a smoke run

Starts two one-broker clusters of real processes side by side on fresh stores
(bench/_secure.py): ``plain`` with no TLS and no authentication; and a secure one, every
service on TLS (certificates made here by tide.certs; mutual TLS between the services,
so the gateway -> storage Append goes over mTLS too) and the cluster secret, with two
gateways: ``tls`` (no user authentication) and ``tls_auth`` (``--auth-enabled``: every
call signed afresh by the client and checked against the user's ACL). The clients reach
the gateways over TLS. The three phases alternate (ABC, CBA, ...) for ``--rounds``
rounds of ``--duration-s``: ``Produce`` calls of ``--batch`` (100) messages of 128 bytes,
``--inflight`` calls at once on one channel per gateway.

Reports messages/s per phase (median over the rounds), ``tls / plain`` and
``tls_auth / plain`` per round (phases back to back) and their medians, and the CPU
microseconds per message of each phase (client + gateway + storage + dispatch, from
/proc) with the CPU-efficiency ratios (plain's CPU per message / the phase's): on a box
shared with other work the rate ratio says how much CPU was left as much as what TLS
costs. Also ``bench/results/tls_cost.json`` with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench._secure import add_load_arguments, alternate, start_cluster, summarize
from bench.gateway_produce_pull import loadavg
from tide.certs import make_ca, make_leaf
from tide.tls import TlsFiles

TOPIC = "BenchTls"
RESULTS = Path(__file__).parent / "results" / "tls_cost.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_load_arguments(parser, duration_s=10.0, rounds=6)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-tls-bench-"))
    load_before = loadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        authority = make_ca(root / "certs")
        leaf = make_leaf(authority, root / "certs", "bench")
        files = TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))
        with ExitStack() as stack:
            gateways = start_cluster(
                stack, root / "plain", tls=None, secure=False, gateways={"plain": False}
            )
            gateways |= start_cluster(
                stack,
                root / "tls",
                tls=files,
                secure=True,
                gateways={"tls": False, "tls_auth": True},
            )
            measured = asyncio.run(alternate(gateways, TOPIC, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = [("tls", "plain"), ("tls_auth", "plain")]
    summary = summarize(args, started, load_before, measured, ratios, RESULTS)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
