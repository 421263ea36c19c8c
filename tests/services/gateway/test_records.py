"""What the gateway writes into the records it encodes: properties and born hosts."""

from __future__ import annotations

from services.gateway.records import (
    LOCAL_BORN_HOST,
    BornHosts,
    message_properties,
)
from tide.format import HostAddress, decode_properties, pack_host, parse_host
from tide.v1 import gateway_pb2 as pb


def test_properties_hold_the_unique_key_tags_keys_and_user_properties() -> None:
    message = pb.ProduceMessage(
        topic="T", body=b"b", tags="TagA", keys=["k1", "k2"], properties={"a": "1", "b": "2"}
    )
    encoded = message_properties(message, "UK")
    assert decode_properties(encoded) == {
        "a": "1",
        "b": "2",
        "UNIQ_KEY": "UK",
        "TAGS": "TagA",
        "KEYS": "k1 k2",
    }


def test_a_plain_message_carries_only_its_unique_key() -> None:
    message = pb.ProduceMessage(topic="T", body=b"b")
    assert message_properties(message, "0A0B") == b"UNIQ_KEY\x010A0B\x02"


def test_non_ascii_values_are_utf8() -> None:
    message = pb.ProduceMessage(topic="T", body=b"b", tags="é")
    assert decode_properties(message_properties(message, "K"))["TAGS"] == "é"


def test_a_peer_without_an_ip_address_gets_the_local_born_host() -> None:
    assert BornHosts().packed("unix:/tmp/socket") == pack_host(parse_host(LOCAL_BORN_HOST))


def test_born_hosts_are_packed_and_cached() -> None:
    hosts = BornHosts()
    packed = hosts.packed("ipv4:10.0.0.1:5000")
    assert packed == pack_host(HostAddress("10.0.0.1", 5000))
    assert hosts.packed("ipv4:10.0.0.1:5000") is packed
    assert len(hosts.packed("ipv6:[2001:db8::1]:7")) == 20


def test_an_unparsable_peer_gets_the_local_born_host() -> None:
    assert BornHosts().packed("ipv4:not-an-address") == pack_host(parse_host(LOCAL_BORN_HOST))
