"""``python -m tide.health_probe PORT [SERVICE] --tls-dir DIR``: a gRPC health check of a
service on this host over TLS, for Kubernetes exec probes (the kubelet's own gRPC probe
speaks plaintext only). Exit status 0 when SERVING, 1 otherwise (the reason on stderr).

DIR holds ``tls.crt``, ``tls.key`` and ``ca.crt`` (a Kubernetes TLS Secret, as
cert-manager writes it): the probe presents the pod's own certificate, as the services'
mutual TLS requires, and connects to 127.0.0.1 (which the certificate must name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tide.tls import TlsError, TlsFiles, channel_credentials

PROBE_TIMEOUT_S = 4.0  # below the probes' timeoutSeconds (5)


def secret_files(directory: Path) -> TlsFiles:
    """The files of a mounted ``kubernetes.io/tls`` Secret (with its ``ca.crt``)."""
    return TlsFiles(
        str(directory / "tls.crt"), str(directory / "tls.key"), str(directory / "ca.crt")
    )


def check(port: int, service: str, files: TlsFiles) -> str | None:
    """None when ``service`` on 127.0.0.1:``port`` is SERVING; otherwise why not."""
    try:
        credentials = channel_credentials(files)
    except TlsError as exc:
        return str(exc)
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=PROBE_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tide.health_probe", description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("service", nargs="?", default="", help="default: the whole server")
    parser.add_argument("--tls-dir", type=Path, required=True, metavar="DIR")
    args = parser.parse_args(argv)
    problem = check(args.port, args.service, secret_files(args.tls_dir))
    if problem is not None:
        print(f"not serving: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
