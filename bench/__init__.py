"""Benchmarks: ``python -m bench.<name>`` (docs/benchmarks.md).

They run gRPC as Tide's processes do (tide/grpc_defaults.py), the relays of
``bench.hop_ceiling`` included (its processes inherit the setting): a ratio to the
ceiling compares like with like."""

from tide.grpc_defaults import use_tide_grpc_defaults

use_tide_grpc_defaults()
