"""``tide user`` and ``tide acl`` against a gateway with --auth-enabled, signing as the
admin from --access-key/--secret-key-file or $TIDE_ACCESS_KEY/$TIDE_SECRET_KEY; a produce
by the new user, signed from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests._cluster import Cluster
from tests.auth.conftest import ADMIN
from tests.cli.test_bench import tiny_workload
from tide.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def tide(
    cluster: Cluster, *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *map(str, args), "--gateway", cluster.gateway.listen],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env={**clean, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_users_and_acls_from_the_cli(auth_cluster: Cluster, tmp_path: Path) -> None:
    admin_secret = tmp_path / "admin.secret"
    admin_secret.write_text(ADMIN.secret_key)
    as_admin = ("--access-key", ADMIN.access_key, "--secret-key-file", admin_secret)
    env_admin = {"TIDE_ACCESS_KEY": ADMIN.access_key, "TIDE_SECRET_KEY": ADMIN.secret_key}
    ok(tide(auth_cluster, "topic", "create", "cli-topic", "--queues", "1", *as_admin))

    created = ok(tide(auth_cluster, "user", "create", "frank", *as_admin))
    secret = created.split("secret key: ")[1].strip()
    assert len(secret) >= 16
    ok(
        tide(
            auth_cluster, "acl", "create", "frank", "Topic:cli-*", "--actions", "Pub", env=env_admin
        )
    )
    listed = json.loads(ok(tide(auth_cluster, "user", "list", "--json", env=env_admin)))
    assert {"access_key": "frank", "user_type": "Normal", "enabled": True} in listed
    assert secret not in json.dumps(listed)
    acls = json.loads(ok(tide(auth_cluster, "acl", "list", "frank", "--json", env=env_admin)))
    assert acls["frank"][0]["resource"] == "Topic:cli-*"

    as_frank = {"TIDE_ACCESS_KEY": "frank", "TIDE_SECRET_KEY": secret}
    wait_until(
        lambda: (
            tide(auth_cluster, "produce", "cli-topic", "--count", "1", env=as_frank).returncode == 0
        ),
        "frank's grant in effect",
    )
    refused = tide(auth_cluster, "topic", "create", "cli-other", env=as_frank)
    assert refused.returncode == 1 and "may not Create on Topic:cli-other" in refused.stderr
    unsigned = tide(auth_cluster, "produce", "cli-topic", "--count", "1")
    assert unsigned.returncode == 1 and "missing authorization" in unsigned.stderr

    ok(tide(auth_cluster, "user", "update", "frank", "--disable", env=env_admin))
    wait_until(
        lambda: (
            "is disabled"
            in tide(auth_cluster, "produce", "cli-topic", "--count", "1", env=as_frank).stderr
        ),
        "frank disabled",
    )
    ok(tide(auth_cluster, "user", "delete", "frank", env=env_admin))
    assert "frank" not in ok(tide(auth_cluster, "acl", "list", env=env_admin))


def test_tide_bench_signs_its_calls(auth_cluster: Cluster, tmp_path: Path) -> None:
    workload = tiny_workload(tmp_path)
    args = ("bench", "run", workload, "--set", "consumers_per_topic=0", "--set", "topics=1",
            "--set", "warmup_s=0", "--set", "duration_s=1", "--json")  # fmt: skip
    env_admin = {"TIDE_ACCESS_KEY": ADMIN.access_key, "TIDE_SECRET_KEY": ADMIN.secret_key}
    report = json.loads(ok(tide(auth_cluster, *args, env=env_admin)))
    assert report["totals"]["published"] > 0 and report["errors"] == 0
    refused = tide(auth_cluster, *args)
    assert refused.returncode != 0
