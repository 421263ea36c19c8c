"""deploy/ passes yamllint, every overlay renders with kustomize, and the rendered
manifests validate strictly against the schemas of two recent Kubernetes minor versions
(kubernetes-validate only warns about a kind it has no schema for: that fails here)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.deploy._manifests import DEPLOY, OVERLAYS, docs, rendered, tool

# Two recent minor versions bundled with kubernetes-validate (the dev extra pins it).
KUBERNETES_VERSIONS = ("1.36.0", "1.37.0")


def test_yamllint_passes_on_deploy() -> None:
    result = subprocess.run(
        [
            tool("yamllint"),
            "--strict",
            "-f",
            "parsable",
            "-c",
            str(DEPLOY / ".yamllint.yaml"),
            str(DEPLOY),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders(overlay: str) -> None:
    kinds = {doc["kind"] for doc in docs(overlay)}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "StorageClass"} <= kinds
    assert all(doc["metadata"].get("name") for doc in docs(overlay))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strictly(overlay: str, version: str) -> None:
    result = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "-k", version, "-"],
        input=rendered(overlay),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = result.stdout + result.stderr
    problems = [line for line in out.splitlines() if not line.startswith("INFO ")]
    assert result.returncode == 0 and not problems, out
    passed = re.findall(r"^INFO .* passed for resource (\S+) ", out, flags=re.M)
    expected = [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in docs(overlay)]
    assert sorted(passed) == sorted(expected), out
