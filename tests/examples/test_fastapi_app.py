"""examples/fastapi_app.py runs as written under uvicorn (a real process) against a real
cluster: POSTs produce through tide.client.aio, GET shows what its push consumer got,
and stopping the server closes the client (the consumer commits and leaves its group)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._cluster import Cluster, cluster_fixture
from tests._service_process import REPO_ROOT, child_env, free_port
from tide.client import Admin
from tide.waiting import wait_until

cluster = cluster_fixture(brokers=1)
TOPIC, GROUP = "T_web", "G_web"
HTTP_TIMEOUT_S = 10.0
WAIT_S = 60.0


def http(method: str, url: str, payload: object = None) -> tuple[int, Any]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def app(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    cluster.create_topic(TOPIC, queues=2)
    port = free_port()
    env = {**child_env(), "TIDE_GATEWAY": cluster.gateway.listen, "TIDE_TOPIC": TOPIC}
    # "first": the messages POSTed before the consumer found its start offsets count too.
    env.update(TIDE_GROUP=GROUP, TIDE_CONSUME_FROM="first")
    args = [sys.executable, "-m", "uvicorn", "--app-dir", "examples", "fastapi_app:app"]
    log = (tmp_path / "uvicorn.log").open("wb")
    process = subprocess.Popen(
        [*args, "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert process.poll() is None, (tmp_path / "uvicorn.log").read_text()[-3000:]
        try:
            status, health = http("GET", f"{base}/health")
        except OSError:  # not listening yet
            return False
        return status == 200 and len(health["queues"]) == 2

    try:
        wait_until(serving, "the app serving with its consumer's queues", WAIT_S)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT_S)
        log.close()


def test_post_produces_and_get_shows_what_the_consumer_received(
    cluster: Cluster, app: tuple[str, subprocess.Popen[bytes]]
) -> None:
    base, process = app
    stored = []
    for i in range(5):
        status, answer = http("POST", f"{base}/messages", {"body": f"hello {i}", "key": f"k{i}"})
        assert status == 201, answer
        stored.append(answer)
    assert len({a["msg_id"] for a in stored}) == 5

    def all_received() -> bool:
        status, messages = http("GET", f"{base}/messages")
        return status == 200 and {m["body"] for m in messages} == {f"hello {i}" for i in range(5)}

    wait_until(all_received, "the consumer's last messages", WAIT_S)
    _, messages = http("GET", f"{base}/messages")
    assert {m["msg_id"] for m in messages} == {a["msg_id"] for a in stored}
    # Bad input: a 422 naming the field, from FastAPI's validation.
    status, answer = http("POST", f"{base}/messages", {"key": "no body"})
    assert status == 422 and answer["detail"][0]["loc"][-1] == "body"
    # Stopping uvicorn runs the lifespan's exit: the consumer leaves the group.
    process.send_signal(signal.SIGINT)
    assert process.wait(WAIT_S) == 0
    with Admin(cluster.gateway.listen) as admin:
        assert admin.consumers(GROUP) == []
