"""ACL 2.0 decisions: literal, prefixed and any resources; deny wins; source ranges;
a super user may do anything; nothing granted means denied."""

from __future__ import annotations

import pytest

from tide.auth.model import (
    Action,
    Decision,
    PolicyEntry,
    Resource,
    ResourceType,
    User,
    UserType,
    decide,
    parse_action,
    parse_network,
    parse_resource_pattern,
)

ALICE = User("alice", "secret-a")
ROOT = User("root", "secret-r", UserType.SUPER)


def entry(
    resource: str,
    *actions: str,
    decision: Decision = Decision.ALLOW,
    sources: tuple[str, ...] = (),
) -> PolicyEntry:
    return PolicyEntry(
        parse_resource_pattern(resource),
        frozenset(parse_action(a) for a in actions),
        decision,
        tuple(parse_network(s) for s in sources),
    )


def topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


POLICIES = (
    entry("Topic:orders", "Pub"),
    entry("Topic:logs-*", "Pub", "Sub"),
    entry("Topic:logs-secret", "All", decision=Decision.DENY),
    entry("Group:*", "Sub"),
    entry("Topic:lan", "Sub", sources=("10.0.0.0/8", "fd00::/8")),
)


@pytest.mark.parametrize(
    ("action", "resource", "source", "allowed"),
    [
        (Action.PUB, topic("orders"), "1.2.3.4", True),
        (Action.SUB, topic("orders"), "1.2.3.4", False),  # only Pub granted
        (Action.PUB, topic("orders2"), "1.2.3.4", False),  # literal: exact name only
        (Action.PUB, topic("logs-app"), "1.2.3.4", True),  # prefixed
        (Action.SUB, topic("logs-"), "1.2.3.4", True),
        (Action.PUB, topic("logs-secret"), "1.2.3.4", False),  # deny wins over the prefix
        (Action.SUB, Resource(ResourceType.GROUP, "any-group"), "1.2.3.4", True),
        (Action.SUB, topic("lan"), "10.1.2.3", True),
        (Action.SUB, topic("lan"), "11.1.2.3", False),
        (Action.SUB, topic("lan"), "fd00::1", True),
        (Action.SUB, topic("lan"), "", False),  # no address: a ranged entry does not match
        (Action.CREATE, topic("orders"), "1.2.3.4", False),
    ],
)
def test_decisions(action: Action, resource: Resource, source: str, allowed: bool) -> None:
    denial = decide(ALICE, POLICIES, [(action, resource)], source)
    assert (denial is None) is allowed
    if denial is not None:
        assert denial.resource == resource and denial.action is action
        assert "secret-a" not in denial.message("alice")


def test_a_super_user_may_do_anything() -> None:
    assert decide(ROOT, (), [(Action.DELETE, topic("orders"))], "") is None


def test_every_need_must_be_allowed() -> None:
    denial = decide(ALICE, POLICIES, [(Action.PUB, topic("orders")), (Action.PUB, topic("x"))], "")
    assert denial is not None and denial.resource == topic("x")
    assert denial.message("alice") == "user 'alice' may not Pub on Topic:x (not granted)"


@pytest.mark.parametrize("text", ["orders", "Queue:x", "", "Topic"])
def test_a_malformed_resource_names_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="expected Topic:NAME"):
        parse_resource_pattern(text)


def test_resource_patterns_print_as_parsed() -> None:
    for text in ("Topic:orders", "Topic:logs-*", "Group:*", "*"):
        assert str(parse_resource_pattern(text)) == text


def test_bad_actions_and_ranges_are_named() -> None:
    with pytest.raises(ValueError, match="expected one of Pub, Sub"):
        parse_action("Publish")
    with pytest.raises(ValueError, match="expected a CIDR"):
        parse_network("10.0.0.0/33")
