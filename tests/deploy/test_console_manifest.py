"""The web console's Deployment and Service (deploy/k8s/base/console.yaml): stateless with
two replicas, the session key from a Secret, /healthz probes on its HTTP port, a command
line and environment the console itself accepts, and TLS under the TLS component."""

from __future__ import annotations

import pytest

from services.console.config import ConfigError, ConsoleConfig, from_args
from tests.deploy._manifests import (
    OVERLAYS,
    TLS_DIR,
    TLS_OVERLAYS,
    Container,
    Doc,
    by_name,
    dockerfile_entrypoint,
    matches,
    pod_labels,
)

pytestmark = pytest.mark.parametrize("overlay", OVERLAYS)
SECRET = "tide-console-session"


def console(overlay: str) -> tuple[Doc, Container]:
    deployment = by_name(overlay, "Deployment", "tide-console")
    [spec] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, Container(overlay, deployment, "tide-console-0", spec)


def config(container: Container) -> ConsoleConfig:
    """The console's own parsing of the container's args and environment."""
    args = container.args()
    assert args[:1] == ["console"], f"{container.where}: args must start with console"
    try:
        return from_args(args[1:], container.env())
    except (ConfigError, SystemExit) as exc:
        raise AssertionError(f"{container.where}: the console refuses it: {exc}") from None


def test_console_is_stateless_with_two_replicas_and_a_budget(overlay: str) -> None:
    deployment, container = console(overlay)
    assert deployment["spec"]["replicas"] == 2
    assert container.spec.get("command") in (None, dockerfile_entrypoint())
    pod = deployment["spec"]["template"]["spec"]
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    budget = by_name(overlay, "PodDisruptionBudget", "tide-console")
    assert matches(budget["spec"]["selector"], pod_labels(deployment))


def test_the_session_key_comes_from_a_secret(overlay: str) -> None:
    deployment, container = console(overlay)
    key_file = config(container).session_key_file
    assert key_file is not None, "replicas must share a session key"
    mounts = {m["name"]: m for m in container.spec["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    [(name, volume)] = [
        (n, v) for n, v in volumes.items() if "secret" in v and v["secret"]["secretName"] == SECRET
    ]
    assert key_file.startswith(mounts[name]["mountPath"].rstrip("/") + "/")
    assert mounts[name].get("readOnly") is True
    assert volume["secret"].get("optional") is not True  # no silent per-pod random key


def test_probes_ask_healthz_on_the_port_it_listens_on(overlay: str) -> None:
    _, container = console(overlay)
    listen_port = config(container).listen_host_port()[1]
    ports = {p["name"]: p["containerPort"] for p in container.spec["ports"]}
    assert ports["http"] == listen_port
    scheme = "HTTPS" if overlay in TLS_OVERLAYS else "HTTP"
    for kind in ("readinessProbe", "livenessProbe"):
        probe = container.spec[kind]["httpGet"]
        assert probe["path"] == "/healthz"
        assert ports.get(probe["port"], probe["port"]) == listen_port
        assert probe.get("scheme", "HTTP") == scheme, f"{container.where}: {kind}"
    service = by_name(overlay, "Service", "tide-console")
    assert service["spec"]["ports"][0]["targetPort"] in ("http", listen_port)


def test_the_console_reaches_the_gateway_service(overlay: str) -> None:
    _, container = console(overlay)
    gateway = by_name(overlay, "Service", "tide-gateway")
    port = gateway["spec"]["ports"][0]["port"]
    assert config(container).gateway == f"tide-gateway.tide.svc.cluster.local:{port}"


def test_tls_component_gives_the_console_the_certificate(overlay: str) -> None:
    _, container = console(overlay)
    settings = config(container)
    if overlay not in TLS_OVERLAYS:
        assert settings.tls_cert_file is None
        return
    assert settings.tls_cert_file == f"{TLS_DIR}/tls.crt"
    assert settings.tls_key_file == f"{TLS_DIR}/tls.key"
    assert settings.tls_ca_file == f"{TLS_DIR}/ca.crt"
    mounts = {m["mountPath"] for m in container.spec["volumeMounts"]}
    assert TLS_DIR in mounts
