"""The RocketMQ 5 request signature: what the official clients send verifies; a wrong
key, an old date-time, a wrong algorithm or malformed metadata is refused, naming it."""

from __future__ import annotations

import binascii
import hashlib
import hmac

import pytest

from tide.auth.signature import (
    AUTHORIZATION_KEY,
    DATE_TIME_KEY,
    AuthenticationError,
    parse_signed,
    sign,
    signed_metadata,
    verify,
)

NOW_S = 1_790_000_000.0


def test_a_signed_request_verifies() -> None:
    signed = parse_signed(signed_metadata("alice", "s3cret", NOW_S))
    assert signed.access_key == "alice"
    verify(signed, "s3cret", 60, NOW_S + 30)


def test_the_signature_is_the_official_clients_hmac_sha1_hex() -> None:
    # rocketmq-clients python/rocketmq/v5/util/signature.py: hexlify(hmac(sk, date, sha1))
    digest = hmac.new(b"key", b"20261127T120000Z", hashlib.sha1).digest()
    assert sign("key", "20261127T120000Z") == binascii.hexlify(digest).decode()
    header = dict(signed_metadata("ak", "sk", NOW_S))[AUTHORIZATION_KEY]
    assert header.startswith("MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, ")


def test_a_wrong_secret_is_refused_without_naming_it() -> None:
    signed = parse_signed(signed_metadata("alice", "s3cret", NOW_S))
    with pytest.raises(AuthenticationError, match="does not match") as caught:
        verify(signed, "other", 60, NOW_S)
    assert "s3cret" not in str(caught.value) and "other" not in str(caught.value)


@pytest.mark.parametrize("offset_s", [-61, 61, 86_400])
def test_a_date_time_outside_the_skew_is_refused(offset_s: float) -> None:
    signed = parse_signed(signed_metadata("alice", "s3cret", NOW_S))
    with pytest.raises(AuthenticationError, match="more than 60 s"):
        verify(signed, "s3cret", 60, NOW_S + offset_s)


def _metadata(authorization: str, date_time: str = "20261127T120000Z") -> list[tuple[str, str]]:
    return [(DATE_TIME_KEY, date_time), (AUTHORIZATION_KEY, authorization)]


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ([], "missing authorization"),
        ([(AUTHORIZATION_KEY, "MQv2-HMAC-SHA1 Credential=a, Signature=ab")], "missing x-mq"),
        (_metadata("HMAC-SHA256 Credential=a, Signature=ab"), "unsupported signature algorithm"),
        (_metadata("MQv2-HMAC-SHA1 Signature=ab"), "needs Credential="),
        (_metadata("MQv2-HMAC-SHA1 Credential=a"), "needs Credential="),
        (_metadata("MQv2-HMAC-SHA1"), "needs Credential="),
        (_metadata("MQv2-HMAC-SHA1 Credential=a, SignedHeaders=host, Signature=ab"), "Signed"),
        (_metadata("MQv2-HMAC-SHA1 Credential=a, Signature=" + "a" * 10_000), "longer than"),
        ([(AUTHORIZATION_KEY, "x" * 10_240), (DATE_TIME_KEY, "1")], "longer than"),
    ],
)
def test_malformed_metadata_is_refused_naming_what_is_wrong(
    metadata: list[tuple[str, str]], expected: str
) -> None:
    with pytest.raises(AuthenticationError, match=expected):
        parse_signed(metadata)


@pytest.mark.parametrize("date_time", ["", "yesterday", "2026-11-27T12:00:00Z", "x" * 10_000])
def test_a_malformed_date_time_is_refused(date_time: str) -> None:
    signed = parse_signed(_metadata("MQv2-HMAC-SHA1 Credential=a, Signature=ab", date_time))
    with pytest.raises(AuthenticationError, match="malformed x-mq-date-time"):
        verify(signed, "sk", 60, NOW_S)


def test_binary_metadata_values_are_ignored() -> None:
    with pytest.raises(AuthenticationError, match="missing authorization"):
        parse_signed([(AUTHORIZATION_KEY + "-bin", b"\x00\x01")])
