"""gRPC's I/O path for Tide's own processes, chosen before ``grpc`` is imported.

grpcio (1.85 here) runs its client channels and servers on its EventEngine by default
(the ``event_engine_client`` and ``event_engine_listener`` experiments). With grpc.aio,
which every Tide service uses, that engine costs about a third more CPU a call than
gRPC's older posix I/O path on this 2-core box (an in-process grpc.aio echo: ~420 us
against ~615 us a call, medians of 5 alternating; whole clusters and
``bench.hop_ceiling``'s relays alike carried 12-21 % more: docs/performance.md "gRPC's
I/O path"). The services, the ``tide`` command line and the benchmarks therefore turn
those two experiments off through ``GRPC_EXPERIMENTS`` unless the operator set that
variable (to anything, even empty: then gRPC's own defaults apply).

gRPC reads the variable once, when it is imported: :func:`use_tide_grpc_defaults` must
run before the first ``import grpc`` of the process (the entry points call it first
thing; tests/test_grpc_defaults.py checks that they do). This module imports nothing of
gRPC. Libraries (``tide.client``) do not call it: an application's gRPC settings are its
own (it may set the same variable, docs/client.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
# What Tide's processes run with when the environment does not say.
TIDE_GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def use_tide_grpc_defaults(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``GRPC_EXPERIMENTS`` to :data:`TIDE_GRPC_EXPERIMENTS` when it is not set; True
    when this set it. Too late (no effect on gRPC) once ``grpc`` is imported: then it
    changes nothing and answers False."""
    env = os.environ if environ is None else environ
    if GRPC_EXPERIMENTS_ENV in env or (environ is None and "grpc" in sys.modules):
        return False
    env[GRPC_EXPERIMENTS_ENV] = TIDE_GRPC_EXPERIMENTS
    return True
