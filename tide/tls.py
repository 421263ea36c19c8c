"""TLS for Tide's gRPC servers and channels (docs/security.md).

Servers (:func:`server_credentials`): the certificate and key are re-read when their files
change (rotation without a restart): gRPC asks :class:`CertificateFiles` for a new
configuration at each new connection's handshake, and the files' mtimes are checked at
most once per ``reload_interval_ms``. Connections already open keep their certificate.

Channels (:func:`channel_credentials`): the CA file verifies the server; a certificate and
key, when given, are presented as the client certificate (mutual TLS: the internal links).

Internal links (:func:`internal_channel`): a service sets its cluster TLS once at start
(:func:`set_internal_tls`, from its ``--tls-*`` options); every channel it opens to another
Tide service then uses TLS with its own certificate as the client certificate, re-read
when the files change (tide._tls_channels). Unset, the channels are plaintext (the
default).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tide._tls_channels import ClientFiles, ReloadingChannel

_log = logging.getLogger("tide.tls")

DEFAULT_RELOAD_INTERVAL_MS = 5_000
MIN_RELOAD_INTERVAL_MS = 10
MAX_RELOAD_INTERVAL_MS = 3_600_000


class TlsError(ValueError):
    """A TLS file option that is missing, unreadable or inconsistent; names the option."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: this side's certificate chain and key, and the CA bundle it trusts."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    @property
    def has_identity(self) -> bool:
        return self.cert_file is not None and self.key_file is not None

    def check(self, *, prefix: str = "--tls-") -> None:
        """Raise :class:`TlsError` for a half-given pair or a file that cannot be read;
        the message names the files as options (``--tls-cert-file``) or, with another
        ``prefix`` such as ``"TlsFiles."``, as fields (``TlsFiles.cert_file``)."""
        cert, key, ca = (_label(prefix, name) for name in ("cert", "key", "ca"))
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsError(f"{cert} and {key} go together: give both")
        for label, path in ((cert, self.cert_file), (key, self.key_file), (ca, self.ca_file)):
            if path is not None:
                _read(path, label)


def _label(prefix: str, name: str) -> str:
    return f"{prefix}{name}-file" if prefix.startswith("--") else f"{prefix}{name}_file"


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as source:
            return source.read()
    except OSError as exc:
        raise TlsError(f"{option}: cannot read {path}: {exc.strerror}") from exc


def channel_credentials(files: TlsFiles, *, prefix: str = "--tls-") -> grpc.ChannelCredentials:
    """Credentials for a channel: ``ca_file`` verifies the server (the system roots when
    None); ``cert_file``/``key_file``, when given, are the client certificate. Errors
    name the files as ``PREFIX{cert,key,ca}-file``."""
    files.check(prefix=prefix)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(files.ca_file, "ca_file") if files.ca_file else None,
        private_key=_read(files.key_file, "key_file") if files.key_file else None,
        certificate_chain=_read(files.cert_file, "cert_file") if files.cert_file else None,
    )


class CertificateFiles:
    """The fetcher behind :func:`server_credentials`: a new configuration when a file's
    mtime (or size) changed since the last load, checked at most every interval."""

    def __init__(self, files: TlsFiles, *, reload_interval_ms: int) -> None:
        if not files.has_identity:
            raise TlsError("TLS on a server needs --tls-cert-file and --tls-key-file")
        self._files = files
        self._interval_s = reload_interval_ms / 1000
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._stamp = self._stamps()

    def _paths(self) -> list[str]:
        return [p for p in (self._files.cert_file, self._files.key_file, self._files.ca_file) if p]

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for path in self._paths():
            try:
                stat = os.stat(path)
            except OSError:
                stamps.append((-1, -1))  # mid-replacement: try again at the next check
            else:
                stamps.append((stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)

    def configuration(self) -> Any:
        """The certificate configuration from the files as they are now."""
        files = self._files
        assert files.cert_file is not None and files.key_file is not None
        pair = (_read(files.key_file, "--tls-key-file"), _read(files.cert_file, "--tls-cert-file"))
        roots = _read(files.ca_file, "--tls-ca-file") if files.ca_file else None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=roots)

    def __call__(self) -> Any:
        """gRPC's fetcher: None keeps the current configuration."""
        with self._lock:
            now = time.monotonic()
            if now < self._next_check:
                return None
            self._next_check = now + self._interval_s
            stamp = self._stamps()
            if stamp == self._stamp or (-1, -1) in stamp:
                return None
            try:
                config = self.configuration()
            except TlsError as exc:  # keep serving the certificate we have
                _log.warning("certificate reload failed, keeping the current one: %s", exc)
                return None
            self._stamp = stamp
            _log.info("reloaded the TLS certificate from %s", files_text(self._files))
            return config


def files_text(files: TlsFiles) -> str:
    return ", ".join(p for p in (files.cert_file, files.key_file, files.ca_file) if p)


def server_credentials(
    files: TlsFiles, *, require_client_cert: bool, reload_interval_ms: int
) -> grpc.ServerCredentials:
    """Server credentials that follow the files (rotation). With ``require_client_cert`` a
    client must present a certificate signed by ``ca_file`` (mutual TLS)."""
    files.check()
    if require_client_cert and files.ca_file is None:
        raise TlsError("mutual TLS needs --tls-ca-file (the CA that signs the clients)")
    fetcher = CertificateFiles(files, reload_interval_ms=reload_interval_ms)
    return grpc.dynamic_ssl_server_credentials(
        fetcher.configuration(), fetcher, require_client_authentication=require_client_cert
    )


# The cluster TLS of this process's links to other Tide services (None: plaintext), and
# the client credentials built from it, re-read when its files change (_tls_channels).
_internal: TlsFiles | None = None
_client_files: ClientFiles | None = None


def set_internal_tls(
    files: TlsFiles | None, *, reload_interval_ms: int = DEFAULT_RELOAD_INTERVAL_MS
) -> None:
    """Use ``files`` for every channel :func:`internal_channel` opens from now on; their
    changes reach those channels' new calls within ``reload_interval_ms``."""
    global _internal, _client_files
    if files is not None:
        files.check()
        paths = [p for p in (files.cert_file, files.key_file, files.ca_file) if p]
        _client_files = ClientFiles(
            paths, lambda: channel_credentials(files), reload_interval_ms=reload_interval_ms
        )
    else:
        _client_files = None
    _internal = files


def internal_tls() -> TlsFiles | None:
    return _internal


def internal_channel(
    target: str,
    options: Sequence[tuple[str, Any]] | None = None,
    interceptors: Sequence[Any] | None = None,
) -> grpc.aio.Channel:
    """A channel to another Tide service: TLS with this service's certificate when the
    cluster TLS is set (a :class:`ReloadingChannel`: a renewed certificate is used by the
    calls after the change), plaintext otherwise."""
    # Imported here: tide.server imports this module at start-up.
    from tide.server._cluster_secret import cluster_channel

    opts = list(options) if options is not None else None
    # The cluster secret (tide.server._cluster_secret) rides every internal link, with
    # or without TLS: storage, dispatch and name server refuse calls without it.
    chain = list(interceptors) if interceptors else None
    channel: grpc.aio.Channel
    if _client_files is None:
        channel = grpc.aio.insecure_channel(target, options=opts, interceptors=chain)
    else:
        channel = ReloadingChannel(
            _client_files,
            lambda credentials: grpc.aio.secure_channel(
                target, credentials, options=opts, interceptors=chain
            ),
        )
    return cluster_channel(channel)
