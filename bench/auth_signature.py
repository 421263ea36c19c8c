"""The cost of authentication (signature + ACL decision) as a ratio of the
unauthenticated path, in the same run (acl, issue 22).

    python -m bench.auth_signature                             # 6 rounds of 5 s per phase
    python -m bench.auth_signature --duration-s 2 --rounds 2   # a smoke run

Starts real processes on a fresh store (bench/_secure.py): a name server, one broker
(storage + dispatch) and TWO gateways in front of it: ``plain`` (no authentication) and
``auth`` (``--auth-enabled``). A normal user granted ``Pub`` on the topic (a prefixed
entry and a deny entry on another topic, so the ACL decision has entries to walk)
produces through ``auth``, each call signed afresh (HMAC-SHA1 of its x-mq-date-time) on
the client side, the unsigned client through ``plain``; the same raw stubs, Produce of
``--batch`` (100) messages of 128 bytes, ``--inflight`` calls in flight. Phases
alternate AB, BA, ... over ``--rounds``. Signatures alone: no TLS (bench/tls_cost.py
measures both together). Reports messages/s per phase (median), auth / plain of each
round (its two phases back to back) and their median; also
``bench/results/auth_signature.json``.
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

TOPIC = "BenchAuth"
RESULTS = Path(__file__).parent / "results" / "auth_signature.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    add_load_arguments(parser, duration_s=5.0, rounds=6)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-auth-bench-"))
    load_before = loadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        with ExitStack() as stack:
            gateways = start_cluster(
                stack,
                root / "cluster",
                tls=None,
                secure=False,
                gateways={"plain": False, "auth": True},
            )
            measured = asyncio.run(alternate(gateways, TOPIC, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarize(args, started, load_before, measured, [("auth", "plain")], RESULTS)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
