"""Options of the ``tide`` format, checked on the driver before anything is planned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tide.client import DEFAULT_GATEWAY, ClientTls, Credentials, TlsFiles
from tide.spark._planning import OffsetSpec, PlanningError, parse_offset_spec

DEFAULT_GROUP = "tide-spark"
# Messages per Pull call (the gateway's limit is 1024).
DEFAULT_PULL_BATCH = 1024
MAX_PULL_BATCH = 1024


class OptionError(PlanningError):
    """A missing or malformed option."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in options.items()}


def _int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = options.get(name.lower())
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name} is {text!r}; give an integer") from None
    if value < 1:
        raise OptionError(f"option {name} is {value}; give 1 or more")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise OptionError(f"option {name} is {text!r}; give true or false")
    return text.lower() == "true"


def tls_of(options: Mapping[str, str]) -> ClientTls:
    """Options tls (true/false) and tlsCaFile / tlsCertFile / tlsKeyFile (any of the files
    turns TLS on): tide.client's ``tls=``."""
    lowered = _lower(options)
    files = TlsFiles(
        cert_file=lowered.get("tlscertfile") or None,
        key_file=lowered.get("tlskeyfile") or None,
        ca_file=lowered.get("tlscafile") or None,
    )
    if (files.cert_file is None) != (files.key_file is None):
        raise OptionError("options tlsCertFile and tlsKeyFile go together: give both")
    if files != TlsFiles():
        return files
    return _bool(options, "tls", False)


@dataclass(frozen=True)
class CredentialsFile:
    """Options accessKey and secretKeyFile: the user every client of the connector signs
    as. Only the file's path travels to the executors (a secret key in an option would
    show in Spark's plans and logs); each reads it when it opens a client."""

    access_key: str
    secret_key_file: str

    def load(self) -> Credentials:
        try:
            secret = Path(self.secret_key_file).read_text().strip()
        except OSError as exc:
            raise OptionError(
                f"option secretKeyFile: cannot read {self.secret_key_file}: {exc.strerror}"
            ) from None
        return Credentials(self.access_key, secret)


def credentials_of(options: Mapping[str, str]) -> CredentialsFile | None:
    """Options accessKey and secretKeyFile (together); None: the environment's
    TIDE_ACCESS_KEY / TIDE_SECRET_KEY, if set, as for every tide.client."""
    lowered = _lower(options)
    access_key, secret_file = lowered.get("accesskey") or None, lowered.get("secretkeyfile")
    if "secretkey" in lowered:
        raise OptionError(
            "option secretKey is not taken (plans and logs show options): give secretKeyFile"
        )
    if (access_key is None) != (secret_file is None):
        raise OptionError("options accessKey and secretKeyFile go together: give both")
    if access_key is None or secret_file is None:
        return None
    CredentialsFile(access_key, secret_file).load()  # a readable file, checked on the driver
    return CredentialsFile(access_key, secret_file)


def signing(credentials: CredentialsFile | None) -> Credentials | None:
    return credentials.load() if credentials is not None else None


def topics_of(options: Mapping[str, str], *, required: bool = True) -> tuple[str, ...]:
    text = _lower(options).get("topic", "")
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if required and not topics:
        raise OptionError("option topic is required (one topic or a comma-separated list)")
    return topics


@dataclass(frozen=True)
class ReadOptions:
    gateway: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    expression: str
    max_per_partition: int | None
    max_per_trigger: int | None
    group: str
    pull_batch: int
    fail_on_data_loss: bool
    tls: ClientTls = False
    credentials: CredentialsFile | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        options = _lower(raw)
        if streaming and "endingoffsets" in options:
            raise OptionError("option endingOffsets is for batch reads only")
        if "startingtimestamp" in options and "startingoffsets" in options:
            raise OptionError("give startingOffsets or startingTimestamp, not both")
        timestamp = _int(options, "startingTimestamp", None)
        pull_batch = _int(options, "pullBatchSize", DEFAULT_PULL_BATCH)
        assert pull_batch is not None
        if pull_batch > MAX_PULL_BATCH:
            raise OptionError(f"option pullBatchSize is {pull_batch}; at most {MAX_PULL_BATCH}")
        # Like Spark's Kafka source: batch reads default to everything stored, streams
        # to new messages only.
        default_start = "latest" if streaming else "earliest"
        return cls(
            gateway=options.get("gateway", DEFAULT_GATEWAY),
            topics=topics_of(options),
            starting=parse_offset_spec(
                options.get("startingoffsets", default_start), "startingOffsets"
            ),
            ending=parse_offset_spec(options.get("endingoffsets", "latest"), "endingOffsets"),
            starting_timestamp_ms=timestamp,
            expression=options.get("expression", "*") or "*",
            max_per_partition=_int(options, "maxMessagesPerPartition", None),
            max_per_trigger=_int(options, "maxMessagesPerTrigger", None),
            group=options.get("group", DEFAULT_GROUP),
            pull_batch=pull_batch,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            tls=tls_of(options),
            credentials=credentials_of(options),
        )
