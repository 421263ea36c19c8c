"""ACL 2.0 users and policies (apache/rocketmq ``auth/``, RIP-68), and the decision.

A user has an access key (its name) and a secret key, and is either a super user (every
action on every resource: admins) or a normal user whose policies decide. A policy entry
grants or denies actions on resources (cluster, topic or group; a literal name, a name
prefix, or any), optionally only from source address ranges (CIDR). A request is allowed
when some entry allows it and none denies it (deny wins); with no matching entry it is
denied.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field


class Action(enum.Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class ResourceType(enum.Enum):
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"
    ANY = "Any"


class Pattern(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"
    ANY = "ANY"


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


class UserType(enum.Enum):
    SUPER = "Super"
    NORMAL = "Normal"


@dataclass(frozen=True)
class Resource:
    """What a request acts on: ``Topic:orders``, ``Group:billing``, ``Cluster:``."""

    type: ResourceType
    name: str = ""

    def __str__(self) -> str:
        return f"{self.type.value}:{self.name}"


@dataclass(frozen=True)
class ResourcePattern:
    """Resources a policy entry covers: ``Topic:orders`` (literal), ``Topic:orders-*``
    (prefixed), ``Topic:*`` (any topic), ``*`` (any resource)."""

    type: ResourceType
    name: str = ""
    pattern: Pattern = Pattern.LITERAL

    def matches(self, resource: Resource) -> bool:
        if self.type is not ResourceType.ANY and self.type is not resource.type:
            return False
        if self.type is ResourceType.ANY or self.pattern is Pattern.ANY:
            return True
        if self.pattern is Pattern.PREFIXED:
            return resource.name.startswith(self.name)
        return resource.name == self.name

    def __str__(self) -> str:
        if self.type is ResourceType.ANY:
            return "*"
        suffix = {Pattern.LITERAL: "", Pattern.PREFIXED: "*", Pattern.ANY: "*"}[self.pattern]
        return f"{self.type.value}:{'' if self.pattern is Pattern.ANY else self.name}{suffix}"


def parse_resource_pattern(text: str) -> ResourcePattern:
    """``Topic:orders``, ``Topic:orders-*``, ``Topic:*``, ``Group:...``, ``Cluster:*``, ``*``
    -> the pattern; ValueError naming the expected form otherwise."""
    if text == "*":
        return ResourcePattern(ResourceType.ANY, "", Pattern.ANY)
    kind, sep, name = text.partition(":")
    types = {t.value.lower(): t for t in ResourceType if t is not ResourceType.ANY}
    if not sep or kind.lower() not in types:
        raise ValueError(
            f"resource {text!r}: expected Topic:NAME, Group:NAME, Cluster:NAME (NAME* for a "
            "prefix, * for any) or *"
        )
    resource_type = types[kind.lower()]
    if name in ("", "*"):
        return ResourcePattern(resource_type, "", Pattern.ANY)
    if name.endswith("*"):
        return ResourcePattern(resource_type, name[:-1], Pattern.PREFIXED)
    return ResourcePattern(resource_type, name, Pattern.LITERAL)


def parse_action(text: str) -> Action:
    for action in Action:
        if action.value.lower() == text.lower():
            return action
    raise ValueError(f"action {text!r}: expected one of {', '.join(a.value for a in Action)}")


@dataclass(frozen=True)
class AnyOf:
    """A need met by any one of these actions (RocketMQ: a route is for Pub or Sub)."""

    actions: tuple[Action, ...]

    @property
    def value(self) -> str:
        return "|".join(a.value for a in self.actions)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PolicyEntry:
    resource: ResourcePattern
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[Network, ...] = ()  # empty: from anywhere

    def matches(self, action: Action | AnyOf, resource: Resource, source_ip: str) -> bool:
        wanted = action.actions if isinstance(action, AnyOf) else (action,)
        if Action.ALL not in self.actions and self.actions.isdisjoint(wanted):
            return False
        if not self.resource.matches(resource):
            return False
        return not self.source_ips or _in_ranges(source_ip, self.source_ips)


def _in_ranges(source_ip: str, ranges: Iterable[Network]) -> bool:
    try:
        address = ipaddress.ip_address(source_ip.strip("[]"))
    except ValueError:  # no IP address (a Unix socket): only an unrestricted entry matches
        return False
    return any(address.version == net.version and address in net for net in ranges)


def parse_network(text: str) -> Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"source address {text!r}: expected a CIDR like 10.0.0.0/8") from None


@dataclass(frozen=True)
class User:
    access_key: str
    secret_key: str = field(repr=False)  # never in a repr, a log line or an error
    user_type: UserType = UserType.NORMAL
    enabled: bool = True


@dataclass(frozen=True)
class Denial:
    """Why a request was not allowed (no secret in it)."""

    action: Action | AnyOf
    resource: Resource
    explicit: bool  # a Deny entry matched (else: no entry allowed it)

    def message(self, access_key: str) -> str:
        why = "denied by a policy" if self.explicit else "not granted"
        return f"user {access_key!r} may not {self.action.value} on {self.resource} ({why})"


def decide(
    user: User,
    entries: Iterable[PolicyEntry],
    needs: Iterable[tuple[Action | AnyOf, Resource]],
    source_ip: str,
) -> Denial | None:
    """None when ``user`` may do every (action, resource) of ``needs`` from ``source_ip``,
    else the first refused one."""
    if user.user_type is UserType.SUPER:
        return None
    entries = tuple(entries)
    for action, resource in needs:
        matching = [e for e in entries if e.matches(action, resource, source_ip)]
        if any(e.decision is Decision.DENY for e in matching):
            return Denial(action, resource, explicit=True)
        if not matching:
            return Denial(action, resource, explicit=False)
    return None
