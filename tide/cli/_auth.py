"""``tide user create|update|delete|list`` and ``tide acl create|update|delete|list``:
users and ACL 2.0 policies through the gateway (RocketMQ's mqadmin createUser / createAcl;
docs/security.md). The caller signs as a super user (--access-key,
--secret-key-file or $TIDE_ACCESS_KEY / $TIDE_SECRET_KEY)."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

from tide.cli._common import EXIT_OK, gateway_parent, guarded
from tide.cli._output import dumps, table
from tide.client import Admin, InvalidArgument, PolicyEntry

GENERATED_SECRET_BYTES = 24


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add_user(subparsers)
    _add_acl(subparsers)


def _add_user(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    user = subparsers.add_parser("user", help="create, update, delete, list users")
    commands = user.add_subparsers(dest="user_command", metavar="SUBCOMMAND", required=True)
    for name, helptext in (
        (
            "create",
            "a new user; without --new-secret-key-file a secret key is generated and printed once",
        ),
        ("update", "change a user's secret key (--new-secret-key-file), type or status"),
    ):
        sub = commands.add_parser(name, parents=[parent], help=helptext)
        sub.add_argument("name", metavar="ACCESS_KEY")
        sub.add_argument("--new-secret-key-file", metavar="FILE", help="the user's secret key")
        sub.add_argument("--super", action="store_true", help="a super user (every action)")
        if name == "update":
            sub.add_argument("--disable", action="store_true", help="refuse its calls")
        sub.set_defaults(handler=guarded(_user_change), change=name)
    delete = commands.add_parser("delete", parents=[parent], help="a user and its ACL")
    delete.add_argument("name", metavar="ACCESS_KEY")
    delete.set_defaults(handler=guarded(_user_delete))
    listing = commands.add_parser("list", parents=[parent], help="users (never their secrets)")
    listing.set_defaults(handler=guarded(_user_list))


def _add_acl(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    acl = subparsers.add_parser("acl", help="create, update, delete, list ACL policies")
    commands = acl.add_subparsers(dest="acl_command", metavar="SUBCOMMAND", required=True)
    for name, helptext in (
        ("create", "a user's first policy entry"),
        ("update", "add a policy entry (replacing the user's entry on the same resource)"),
    ):
        sub = commands.add_parser(name, parents=[parent], help=helptext)
        sub.add_argument("name", metavar="ACCESS_KEY")
        sub.add_argument(
            "resource", metavar="RESOURCE", help="Topic:NAME, Topic:PREFIX*, Group:*, Cluster:*, *"
        )
        sub.add_argument(
            "--actions",
            required=True,
            help="comma separated: Pub,Sub,Create,Update,Delete,Get,List,All",
        )
        sub.add_argument("--deny", action="store_true", help="deny (deny wins over allow)")
        sub.add_argument(
            "--source-ip", action="append", default=[], metavar="CIDR", help="only from these"
        )
        sub.set_defaults(handler=guarded(_acl_change), change=name)
    delete = commands.add_parser(
        "delete", parents=[parent], help="a user's entries on RESOURCEs (all without)"
    )
    delete.add_argument("name", metavar="ACCESS_KEY")
    delete.add_argument("resources", metavar="RESOURCE", nargs="*")
    delete.set_defaults(handler=guarded(_acl_delete))
    listing = commands.add_parser("list", parents=[parent], help="policy entries")
    listing.add_argument("name", metavar="ACCESS_KEY", nargs="?", default="")
    listing.set_defaults(handler=guarded(_acl_list))


def _secret(args: argparse.Namespace, *, generate: bool) -> tuple[str, bool]:
    if args.new_secret_key_file:
        try:
            return Path(args.new_secret_key_file).read_text().strip(), False
        except OSError as exc:
            raise InvalidArgument(f"--new-secret-key-file: {exc.strerror}") from None
    if generate:
        return secrets.token_urlsafe(GENERATED_SECRET_BYTES), True
    return "", False  # update: keep the secret key


def _user_change(args: argparse.Namespace) -> int:
    secret, generated = _secret(args, generate=args.change == "create")
    kind = "Super" if args.super else "Normal"
    with Admin(args.gateway) as admin:
        if args.change == "create":
            admin.create_user(args.name, secret, kind)
        else:
            admin.update_user(args.name, secret, kind, enabled=not args.disable)
    if generated:  # shown once, on stdout only, for the operator to hand over
        print(f"access key: {args.name}\nsecret key: {secret}")
    else:
        print(f"user {args.name}: {args.change}d")
    return EXIT_OK


def _user_delete(args: argparse.Namespace) -> int:
    with Admin(args.gateway) as admin:
        admin.delete_user(args.name)
    print(f"user {args.name}: deleted")
    return EXIT_OK


def _user_list(args: argparse.Namespace) -> int:
    with Admin(args.gateway) as admin:
        users = admin.list_users()
    if args.json:
        print(dumps([u._asdict() for u in users]))
    else:
        print(table(("ACCESS KEY", "TYPE", "ENABLED"), [list(u) for u in users]))
    return EXIT_OK


def _acl_change(args: argparse.Namespace) -> int:
    entry = PolicyEntry(
        args.resource,
        [a.strip() for a in args.actions.split(",") if a.strip()],
        "Deny" if args.deny else "Allow",
        args.source_ip,
    )
    with Admin(args.gateway) as admin:
        if args.change == "create":
            admin.create_acl(args.name, [entry])
        else:
            admin.update_acl(args.name, [entry])
    print(f"acl of {args.name}: {args.change}d")
    return EXIT_OK


def _acl_delete(args: argparse.Namespace) -> int:
    with Admin(args.gateway) as admin:
        admin.delete_acl(args.name, args.resources)
    print(f"acl of {args.name}: deleted")
    return EXIT_OK


def _acl_list(args: argparse.Namespace) -> int:
    with Admin(args.gateway) as admin:
        acls = admin.list_acls(args.name)
    if args.json:
        print(dumps({k: [e._asdict() for e in v] for k, v in acls.items()}))
        return EXIT_OK
    rows = [
        [user, e.resource, ",".join(e.actions), e.decision, ",".join(e.source_ips) or "*"]
        for user, entries in sorted(acls.items())
        for e in entries
    ]
    print(table(("USER", "RESOURCE", "ACTIONS", "DECISION", "FROM"), rows))
    return EXIT_OK
