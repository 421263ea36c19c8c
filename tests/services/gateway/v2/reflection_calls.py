"""A grpcurl-style caller: every call through server reflection only (grpc_requests), no
Tide or RocketMQ stubs in the process. Reads ``[[method, request, kind], ...]`` as JSON
on stdin (kind: unary, server_stream or bidi, whose request is a list), prints one JSON
line per call: the answer (a list for streams) or the gRPC error."""

from __future__ import annotations

import json
import sys
from typing import Any

import grpc
from grpc_requests import Client  # type: ignore[import-untyped]

SERVICE = "apache.rocketmq.v2.MessagingService"
CALL_TIMEOUT_S = 30.0


def call(client: Any, method: str, request: Any, kind: str) -> Any:
    if kind == "bidi":
        return list(client.stream_stream(SERVICE, method, iter(request), timeout=CALL_TIMEOUT_S))
    if kind == "server_stream":
        return list(client.unary_stream(SERVICE, method, request, timeout=CALL_TIMEOUT_S))
    return client.unary_unary(SERVICE, method, request, timeout=CALL_TIMEOUT_S)


def main() -> None:
    client = Client.get_by_endpoint(sys.argv[1])
    print(json.dumps({"services": sorted(client.service_names)}), flush=True)
    for method, request, kind in json.load(sys.stdin):
        try:
            answer = {"method": method, "reply": call(client, method, request, kind)}
        except grpc.RpcError as exc:
            answer = {"method": method, "error": str(exc.code())}
        print(json.dumps(answer), flush=True)
    assert not any(name.startswith(("tide", "rocketmq")) for name in sys.modules), "stubs used"


if __name__ == "__main__":
    main()
