"""Users and ACLs reach the slaves with the metadata sync (config/users.json and
config/acl.json, mode 0600), and a slave refuses changes (they go to the master). Every
service runs with the cluster secret: registration, replication (a bidirectional
stream), metadata sync, dispatch tails and the gateway's calls all carry it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN, init_user_file, stub_as
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until


def test_users_and_acls_are_copied_to_slaves(tmp_path: Path) -> None:
    secret_file = tmp_path / "cluster.secret"
    secret_file.write_text("replication-cluster-secret-0123")
    secret = ["--cluster-secret-file", str(secret_file)]
    with Cluster(
        tmp_path / "cluster",
        brokers=1,
        replicas=2,
        nameserver_args=secret,
        dispatch_args=secret,
        storage_args=[
            *secret,
            "--auth-init-user-file",
            str(init_user_file(tmp_path)),
            "--metadata-sync-interval-ms",
            "200",
        ],
        gateway_args=[*secret, "--auth-enabled", "--auth-refresh-interval-ms", "200"],
    ) as cluster:
        admin = stub_as(cluster, ADMIN)
        wait_until(lambda: _ok(lambda: admin.ListUsers(pb.ListUsersRequest(), timeout=5)), "admin")
        admin.CreateTopic(pb.CreateTopicRequest(topic="replicated"), timeout=30)
        produce = pb.ProduceRequest(messages=[pb.ProduceMessage(topic="replicated", body=b"x")])
        admin.Produce(produce, timeout=10)
        slave_storage = cluster.brokers[0].slaves[0].storage
        wait_until(  # the slave replicated the commitlog (its stub sends the secret)
            lambda: (
                slave_storage.stub.GetStatus(storage_pb.GetStatusRequest(), timeout=10).max_offset
                > 0
            ),
            "the slave's copy of the commitlog",
        )
        user = storage_pb.AuthUser(access_key="grace", secret_key="grace-secret-123")
        admin.CreateUser(pb.UserRequest(user=user), timeout=10)
        entry = storage_pb.AuthPolicyEntry(resource="Topic:g-*", actions=["Pub"])
        acl = storage_pb.AuthAcl(access_key="grace", entries=[entry])
        admin.CreateAcl(pb.AclRequest(acl=acl), timeout=10)

        slave = cluster.brokers[0].slaves[0].storage
        config_dir = slave.store_dir / "config"

        def copied() -> bool:
            try:
                users = json.loads((config_dir / "users.json").read_text())
                acls = json.loads((config_dir / "acl.json").read_text())
            except FileNotFoundError:
                return False
            names = {u["username"] for u in users["users"]}
            return "grace" in names and any(a["subject"] == "User:grace" for a in acls["acls"])

        wait_until(copied, "the slave's copy of users.json and acl.json")
        for name in ("users.json", "acl.json"):
            assert stat.S_IMODE((config_dir / name).stat().st_mode) == 0o600
        answer = slave.stub.GetAuth(storage_pb.GetAuthRequest(), timeout=10)
        assert "grace" in {u.access_key for u in answer.users}  # loaded, not only written
        change = storage_pb.ChangeAuthRequest(operation="delete_user", user=user)
        with pytest.raises(grpc.RpcError) as caught:
            slave.stub.ChangeAuth(change, timeout=10)
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION


def _ok(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError:
        return False
    return True
