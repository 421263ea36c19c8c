"""Request signatures as RocketMQ 5 clients make them (apache/rocketmq-clients, RIP-68).

The client sends ``x-mq-date-time: 20260101T120000Z`` and
``authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1 of the date-time value keyed by the secret key>``. The server
recomputes the HMAC with the stored secret key, compares in constant time, and refuses a
date-time further than the allowed skew from its clock (a captured header replays only
within that window).
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import hmac
import time
from collections.abc import Iterable
from dataclasses import dataclass

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION_KEY = "authorization"
DATE_TIME_KEY = "x-mq-date-time"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# Longest authorization / date-time values read; longer ones are refused unparsed.
AUTHORIZATION_MAX_CHARS = 512
DATE_TIME_CHARS = len("20260101T120000Z")
ACCESS_KEY_MAX_CHARS = 128


class AuthenticationError(Exception):
    """A request without a valid signature; the message names what is wrong, never a key."""


@dataclass(frozen=True)
class SignedRequest:
    access_key: str
    date_time: str
    signature: str


def sign(secret_key: str, date_time: str) -> str:
    """Hex HMAC-SHA1 of ``date_time`` keyed by ``secret_key`` (the official clients')."""
    mac = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1)
    return mac.hexdigest()


def signed_metadata(
    access_key: str, secret_key: str, now_s: float | None = None
) -> tuple[tuple[str, str], ...]:
    """The two metadata entries a signed call sends, stamped ``now_s`` (UTC)."""
    stamp = time.strftime(DATE_TIME_FORMAT, time.gmtime(time.time() if now_s is None else now_s))
    authorization = (
        f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME_KEY}, "
        f"Signature={sign(secret_key, stamp)}"
    )
    return ((DATE_TIME_KEY, stamp), (AUTHORIZATION_KEY, authorization))


def parse_signed(metadata: Iterable[tuple[str, str | bytes]]) -> SignedRequest:
    """The signature a call's metadata carries; AuthenticationError when absent or malformed."""
    authorization = date_time = None
    for key, value in metadata:
        if key == AUTHORIZATION_KEY and isinstance(value, str):
            authorization = value
        elif key == DATE_TIME_KEY and isinstance(value, str):
            date_time = value
    if authorization is None:
        raise AuthenticationError("missing authorization metadata (sign the request)")
    if len(authorization) > AUTHORIZATION_MAX_CHARS:
        raise AuthenticationError(
            f"authorization metadata longer than {AUTHORIZATION_MAX_CHARS} characters"
        )
    if date_time is None:
        raise AuthenticationError(f"missing {DATE_TIME_KEY} metadata (it is what is signed)")
    algorithm, _, rest = authorization.partition(" ")
    if algorithm != ALGORITHM:
        raise AuthenticationError(f"unsupported signature algorithm; expected {ALGORITHM}")
    fields = _fields(rest)
    access_key = fields.get("Credential", "").split("/", 1)[0]
    signature = fields.get("Signature", "")
    if not access_key or len(access_key) > ACCESS_KEY_MAX_CHARS or not signature:
        raise AuthenticationError("malformed authorization: needs Credential= and Signature=")
    if fields.get("SignedHeaders", DATE_TIME_KEY).lower() != DATE_TIME_KEY:
        raise AuthenticationError(f"unsupported SignedHeaders; expected {DATE_TIME_KEY}")
    return SignedRequest(access_key, date_time, signature)


def _fields(text: str) -> dict[str, str]:
    fields = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields[name] = value.strip()
    return fields


# Parsed date-times kept (strptime is most of a signature check; a client stamps many
# calls with the same second, so the gateway sees few distinct values per second).
DATE_TIME_CACHE_MAX_COUNT = 1024


@functools.lru_cache(maxsize=DATE_TIME_CACHE_MAX_COUNT)
def date_time_s(date_time: str) -> float:
    """Seconds since the epoch of an ``x-mq-date-time`` value (UTC)."""
    if len(date_time) != DATE_TIME_CHARS:
        raise AuthenticationError(f"malformed {DATE_TIME_KEY}; expected e.g. 20260101T120000Z")
    try:
        return float(calendar.timegm(time.strptime(date_time, DATE_TIME_FORMAT)))
    except ValueError:
        raise AuthenticationError(
            f"malformed {DATE_TIME_KEY}; expected e.g. 20260101T120000Z"
        ) from None


def verify(request: SignedRequest, secret_key: str, max_skew_s: float, now_s: float) -> None:
    """AuthenticationError unless ``request`` was signed with ``secret_key`` at a time
    within ``max_skew_s`` of ``now_s``. The signature is compared in constant time."""
    stamped_s = date_time_s(request.date_time)
    if abs(now_s - stamped_s) > max_skew_s:
        raise AuthenticationError(
            f"{DATE_TIME_KEY} is more than {max_skew_s:g} s from the server's clock "
            "(expired or replayed signature, or a client clock off)"
        )
    expected = sign(secret_key, request.date_time)
    if not hmac.compare_digest(expected.encode(), request.signature.lower().encode()):
        raise AuthenticationError("signature does not match (wrong secret key?)")
