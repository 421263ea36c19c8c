"""Semantic checks of the rendered overlays: what a schema cannot see.

Every container's command line is run through its service's own option parser and
``check_config`` (flags, ``TIDE_*`` environment and the mounted config file), so an
unknown flag, a bad value or an inconsistent broker role fails here, not at rollout.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import yaml

from tests.deploy._manifests import (
    AUTH_DIR,
    AUTH_OVERLAYS,
    CONSOLE,
    ENTRYPOINT,
    GRPC_SERVICE_NAMES,
    K8S,
    OVERLAYS,
    TLS_DIR,
    TLS_OVERLAYS,
    Container,
    Doc,
    all_env_names,
    by_name,
    component,
    dockerfile_entrypoint,
    docs,
    env_names,
    image_env,
    matches,
    pod_labels,
    pod_names,
    quantity,
    replicas,
    stable_dns,
    tide_containers,
    workloads,
)
from tide.format import IndexGeometry

NVME_LABEL = "tide.io/local-nvme"
GROUP_LABEL = "tide.io/broker-group"
ROLE_LABEL = "tide.io/broker-role"
HOSTNAME = "kubernetes.io/hostname"
MIB = 1 << 20

pytestmark = pytest.mark.parametrize("overlay", OVERLAYS)


def storage_sets(overlay: str) -> list[Doc]:
    return [w for w in workloads(overlay) if component(w) == "storage"]


def containers_of(overlay: str, workload: Doc) -> dict[str, Container]:
    return {
        c.spec["name"]: c
        for c in tide_containers(overlay)
        if c.workload["metadata"]["name"] == workload["metadata"]["name"]
    }


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


# -- labels, selectors, services, ports ------------------------------------------------


def test_recommended_labels(overlay: str) -> None:
    for doc in docs(overlay):
        labels = doc["metadata"].get("labels", {})
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("app.kubernetes.io/part-of") == "tide", where
        assert labels.get("app.kubernetes.io/managed-by") == "kustomize", where
        if doc["kind"] not in ("ConfigMap",):
            assert labels.get("app.kubernetes.io/name") == "tide", where
    for workload in workloads(overlay):
        labels = pod_labels(workload)
        assert labels.get("app.kubernetes.io/name") == "tide"
        assert labels.get("app.kubernetes.io/component") in {*GRPC_SERVICE_NAMES, CONSOLE}


def test_namespaced_objects_are_in_namespace_tide(overlay: str) -> None:
    # The stable DNS names in args and the tide-cluster ConfigMap name namespace "tide".
    cluster_scoped = {"Namespace", "StorageClass", "PersistentVolume"}
    for doc in docs(overlay):
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == "tide", doc["metadata"]["name"]


def test_workload_selectors_match_their_pods(overlay: str) -> None:
    for workload in workloads(overlay):
        assert matches(workload["spec"]["selector"], pod_labels(workload)), workload["metadata"]
    # No two workloads' selectors overlap (a controller would fight over the pods).
    for a in workloads(overlay):
        for b in workloads(overlay):
            if a is not b:
                assert not matches(a["spec"]["selector"], pod_labels(b)), (
                    f"{a['metadata']['name']} selects {b['metadata']['name']}'s pods"
                )


def test_services_select_pods_and_their_ports_exist(overlay: str) -> None:
    for service in docs(overlay, "Service"):
        selected = [
            w for w in workloads(overlay) if matches(service["spec"]["selector"], pod_labels(w))
        ]
        name = service["metadata"]["name"]
        assert selected, f"Service {name} selects no pods"
        for workload in selected:
            ports = {
                port.get("name"): port["containerPort"]
                for container in pod_spec(workload)["containers"]
                for port in container.get("ports", [])
            }
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                if isinstance(target, str):
                    assert target in ports, f"Service {name}: no container port named {target}"
                    assert ports[target] == port["port"], f"Service {name}: {target}"
                else:
                    assert target in ports.values(), f"Service {name}: no container port {target}"


def test_statefulsets_have_a_headless_governing_service(overlay: str) -> None:
    for sts in docs(overlay, "StatefulSet"):
        service = by_name(overlay, "Service", sts["spec"]["serviceName"])
        assert service["spec"].get("clusterIP") == "None", service["metadata"]["name"]
        assert matches(service["spec"]["selector"], pod_labels(sts))
        # The service selects this StatefulSet's pods only: pod DNS names are per set.
        others = [w for w in workloads(overlay) if w is not sts]
        assert not any(matches(service["spec"]["selector"], pod_labels(w)) for w in others)


def probe_target(container: Container, probe: Doc) -> tuple[int, str]:
    """(port, health service) of a probe: the kubelet's gRPC probe, or with TLS (which
    that probe cannot speak) an exec of ``python -m tide.health_probe`` over TLS."""
    if container.overlay not in TLS_OVERLAYS:
        grpc = probe.get("grpc")
        assert grpc, f"{container.where}: not a gRPC probe"
        return grpc["port"], grpc.get("service", "")
    assert "grpc" not in probe, f"{container.where}: a plaintext gRPC probe with TLS on"
    command = probe["exec"]["command"]
    assert command[:3] == ["python", "-m", "tide.health_probe"], container.where
    assert command[-2:] == ["--tls-dir", TLS_DIR], container.where
    args = command[3:-2]
    return int(args[0]), args[1] if len(args) > 1 else ""


def test_probes_are_grpc_health_checks_on_a_container_port(overlay: str) -> None:
    for container in tide_containers(overlay):
        spec = container.spec
        ports = {port["containerPort"] for port in spec.get("ports", [])}
        listen_port = int(container.config().get_str("listen").rpartition(":")[2])
        assert listen_port in ports, f"{container.where}: listens on {listen_port}, not a port"
        full_name = GRPC_SERVICE_NAMES[container.service]
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            if kind not in spec:
                assert kind == "startupProbe", f"{container.where}: no {kind}"
                continue
            port, service = probe_target(container, spec[kind])
            assert port == listen_port, f"{container.where}: {kind} port {port}"
            assert service in ("", full_name), f"{container.where}: {kind}"
        assert probe_target(container, spec["readinessProbe"])[1] == full_name, container.where


def test_tls_overlays_mount_the_secret_and_set_every_tls_option(overlay: str) -> None:
    for container in tide_containers(overlay):
        config = container.config()
        if overlay not in TLS_OVERLAYS:
            assert config.get_optional_str("tls_cert_file") is None, container.where
            continue
        assert config.get_optional_str("tls_cert_file") == f"{TLS_DIR}/tls.crt"
        assert config.get_optional_str("tls_key_file") == f"{TLS_DIR}/tls.key"
        assert config.get_optional_str("tls_ca_file") == f"{TLS_DIR}/ca.crt"
        mounts = {m["mountPath"]: m for m in container.spec["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(container.workload)["volumes"]}
        volume = volumes[mounts[TLS_DIR]["name"]]
        assert volume["secret"]["secretName"] == "tide-tls", container.where
        assert mounts[TLS_DIR].get("readOnly") is True, container.where


def _secret_files(container: Container, secret_name: str) -> set[str]:
    """The files of Secret ``secret_name`` the container sees (mount path + item path)."""
    volumes = {v["name"]: v for v in pod_spec(container.workload)["volumes"]}
    seen = set()
    for mount in container.spec.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")  # a claim template: none
        if secret is None or secret["secretName"] != secret_name:
            continue
        assert mount.get("readOnly") is True, container.where
        items = [item["path"] for item in secret["items"]]
        if "subPath" in mount:
            assert mount["subPath"] in items, container.where
            seen.add(mount["mountPath"])
        else:
            seen.update(f"{mount['mountPath']}/{path}" for path in items)
    return seen


def test_auth_overlays_give_every_service_the_cluster_secret(overlay: str) -> None:
    """With the auth component every service runs --cluster-secret-file from the Secret
    tide-auth, the gateway --auth-enabled, the storage its first super user from it."""
    for container in tide_containers(overlay):
        config = container.config()
        secret_file = config.get_optional_str("cluster_secret_file")
        if overlay not in AUTH_OVERLAYS:
            assert secret_file is None, container.where
            if container.service == "gateway":
                assert config.get_bool("auth_enabled") is False, container.where
            continue
        files = _secret_files(container, "tide-auth")
        assert secret_file == f"{AUTH_DIR}/cluster.secret" and secret_file in files
        if container.service == "gateway":
            assert config.get_bool("auth_enabled") is True, container.where
        if container.service == "storage":
            init_user = config.get_optional_str("auth_init_user_file")
            assert init_user == f"{AUTH_DIR}/admin.json" and init_user in files
        else:  # the super user's password only where it is read
            assert f"{AUTH_DIR}/admin.json" not in files, container.where


# -- Prometheus metrics ------------------------------------------------------------------

METRICS_PORT_PREFIX = "metrics"
SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def metrics_port(container: Container) -> int:
    """The port of the container's --metrics-listen (it must be on, on every address)."""
    listen = container.config().get_optional_str("metrics_listen")
    assert listen, f"{container.where}: no --metrics-listen (no Prometheus endpoint)"
    host, _, port = listen.rpartition(":")
    assert host == "0.0.0.0", f"{container.where}: metrics on {host}, not reachable from outside"
    assert int(port) > 0, f"{container.where}: a fixed port is needed to scrape it"
    return int(port)


def test_every_container_serves_metrics_on_a_named_port(overlay: str) -> None:
    seen = set()
    for container in tide_containers(overlay):
        port = metrics_port(container)
        named = [p for p in container.spec.get("ports", []) if p["containerPort"] == port]
        assert len(named) == 1, f"{container.where}: --metrics-listen port {port} is not declared"
        name = named[0].get("name", "")
        assert name == METRICS_PORT_PREFIX or name.startswith(METRICS_PORT_PREFIX + "-"), (
            f"{container.where}: name the metrics port {METRICS_PORT_PREFIX}[-...], not {name!r}"
        )
        seen.add(container.service)
    assert seen == set(GRPC_SERVICE_NAMES)


def test_ports_of_a_pod_do_not_collide(overlay: str) -> None:
    # Containers of a pod share its network namespace: every listen port once.
    for workload in workloads(overlay):
        ports = []
        for container in containers_of(overlay, workload).values():
            config = container.config()
            ports.append(int(config.get_str("listen").rpartition(":")[2]))
            ports.append(metrics_port(container))
        assert len(ports) == len(set(ports)), f"{workload['metadata']['name']}: {ports}"


def test_pods_carry_prometheus_scrape_annotations(overlay: str) -> None:
    for workload in workloads(overlay):
        if component(workload) == CONSOLE:
            continue  # no metrics of its own: it shows the services'
        name = workload["metadata"]["name"]
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        scrape, port, path = (annotations.get(key) for key in SCRAPE_ANNOTATIONS)
        assert scrape == "true", f"{name}: prometheus.io/scrape is {scrape!r}"
        assert path == "/metrics", f"{name}: prometheus.io/path is {path!r}"
        # The port is the main container's (the pod's component); a sidecar has its own
        # metrics-* port, for a scrape config that keeps container ports by name.
        main = [
            c for c in containers_of(overlay, workload).values() if c.service == component(workload)
        ]
        assert len(main) == 1, f"{name}: no {component(workload)} container"
        assert port == str(metrics_port(main[0])), f"{name}: prometheus.io/port is {port!r}"


# -- resources -------------------------------------------------------------------------


def test_every_container_has_requests_and_limits(overlay: str) -> None:
    for workload in workloads(overlay):
        for spec in pod_spec(workload)["containers"]:
            resources = spec.get("resources", {})
            where = f"{workload['metadata']['name']}/{spec['name']}"
            for kind in ("cpu", "memory"):
                request = resources.get("requests", {}).get(kind)
                limit = resources.get("limits", {}).get(kind)
                assert request is not None and limit is not None, f"{where}: {kind}"
                assert quantity(request) <= quantity(limit), f"{where}: {kind} request > limit"


def test_storage_memory_holds_the_mapped_segments(overlay: str) -> None:
    # See deploy/k8s/README.md ("Memory"): the segment being written, the next one
    # (preallocated and warmed) and the one before (read by dispatch, slaves and recent
    # consumers) are resident in the container's page cache, plus the Python heap.
    for sts in storage_sets(overlay):
        containers = containers_of(overlay, sts)
        storage = containers["storage"]
        segment = storage.config().get_int("segment_size_bytes")
        limit = quantity(storage.spec["resources"]["limits"]["memory"])
        assert limit >= 3 * segment + 512 * MIB, f"{storage.where}: {limit} < 3 segments + heap"
        dispatch = containers["dispatch"].config()
        index = IndexGeometry(
            dispatch.get_int("index_slot_count"), dispatch.get_int("index_max_entries")
        )
        dispatch_limit = quantity(containers["dispatch"].spec["resources"]["limits"]["memory"])
        assert dispatch_limit >= index.file_bytes + 256 * MIB, containers["dispatch"].where


# -- local NVMe volumes and placement --------------------------------------------------


def test_storage_class_is_local_and_waits_for_the_first_consumer(overlay: str) -> None:
    classes = docs(overlay, "StorageClass")
    assert classes
    for sc in classes:
        assert sc["provisioner"] == "kubernetes.io/no-provisioner"
        assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    for sts in storage_sets(overlay):
        claims = sts["spec"]["volumeClaimTemplates"]
        assert claims, sts["metadata"]["name"]
        for claim in claims:
            assert claim["spec"]["storageClassName"] in {c["metadata"]["name"] for c in classes}


def nvme_terms_require_label(terms: list[Doc]) -> bool:
    """Every node selector term (they are ORed) requires tide.io/local-nvme=true."""
    return bool(terms) and all(
        any(
            e["key"] == NVME_LABEL and e["operator"] == "In" and e["values"] == ["true"]
            for e in term.get("matchExpressions", [])
        )
        for term in terms
    )


def test_local_persistent_volumes_are_pinned_to_nvme_nodes(overlay: str) -> None:
    pvs = docs(overlay, "PersistentVolume")
    assert pvs, "no example local PersistentVolumes"
    classes = {c["metadata"]["name"] for c in docs(overlay, "StorageClass")}
    claims = [
        (sts, claim)
        for sts in storage_sets(overlay)
        for claim in sts["spec"]["volumeClaimTemplates"]
        for _ in range(sts["spec"].get("replicas", 1))
    ]
    for pv in pvs:
        spec, name = pv["spec"], pv["metadata"]["name"]
        assert spec["storageClassName"] in classes, name
        assert spec["local"]["path"].startswith("/"), name
        terms = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert nvme_terms_require_label(terms), f"PV {name}: no {NVME_LABEL}=true affinity"
        assert all(any(e["key"] == HOSTNAME for e in term["matchExpressions"]) for term in terms), (
            f"PV {name}: a local volume is on one node: name it ({HOSTNAME})"
        )
        assert spec["persistentVolumeReclaimPolicy"] == "Retain", name
    # Enough volumes, each big enough, for every claim.
    assert len(pvs) >= len(claims), f"{len(pvs)} local PVs for {len(claims)} claims"
    smallest = min(quantity(pv["spec"]["capacity"]["storage"]) for pv in pvs)
    for sts, claim in claims:
        wanted = quantity(claim["spec"]["resources"]["requests"]["storage"])
        assert smallest >= wanted, f"{sts['metadata']['name']}: claims more than a PV holds"


def test_storage_pods_require_nvme_nodes(overlay: str) -> None:
    for sts in storage_sets(overlay):
        affinity = pod_spec(sts)["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert nvme_terms_require_label(terms), sts["metadata"]["name"]


def test_master_and_slave_of_a_group_never_share_a_node(overlay: str) -> None:
    groups: dict[str, list[Doc]] = defaultdict(list)
    for sts in storage_sets(overlay):
        groups[pod_labels(sts)[GROUP_LABEL]].append(sts)
    for group, members in groups.items():
        for sts in members:
            rules = pod_spec(sts)["affinity"]["podAntiAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            for other in members:
                pair = f"{sts['metadata']['name']} and {other['metadata']['name']}"
                assert any(
                    r["topologyKey"] == HOSTNAME and matches(r["labelSelector"], pod_labels(other))
                    for r in rules
                ), f"{group}: {pair} may share a node"

    # Nodes with local PVs: a group of N members needs N distinct nodes.
    nodes = {
        value
        for pv in docs(overlay, "PersistentVolume")
        for term in pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        for e in term["matchExpressions"]
        if e["key"] == HOSTNAME
        for value in e["values"]
    }
    assert all(len(nodes) >= len(members) for members in groups.values())


# -- disruption budgets and autoscaling ------------------------------------------------


def test_disruption_budgets_cover_pods_and_allow_a_drain(overlay: str) -> None:
    for pdb in docs(overlay, "PodDisruptionBudget"):
        name, spec = pdb["metadata"]["name"], pdb["spec"]
        covered = [w for w in workloads(overlay) if matches(spec["selector"], pod_labels(w))]
        assert covered, f"PDB {name} selects no pods"
        pods = sum(replicas(overlay, w) for w in covered)
        assert ("minAvailable" in spec) != ("maxUnavailable" in spec), name
        if "maxUnavailable" in spec:
            assert isinstance(spec["maxUnavailable"], int), name
            assert 1 <= spec["maxUnavailable"] < max(pods, 2), f"PDB {name}: {pods} pods"
        else:
            assert isinstance(spec["minAvailable"], int), name
            assert spec["minAvailable"] < pods, f"PDB {name} blocks every drain of {pods} pods"
    # Every workload is covered by exactly one budget.
    for workload in workloads(overlay):
        budgets = [
            p
            for p in docs(overlay, "PodDisruptionBudget")
            if matches(p["spec"]["selector"], pod_labels(workload))
        ]
        assert len(budgets) == 1, workload["metadata"]["name"]


def test_autoscaled_gateway(overlay: str) -> None:
    hpa = by_name(overlay, "HorizontalPodAutoscaler", "tide-gateway")
    ref = hpa["spec"]["scaleTargetRef"]
    target = by_name(overlay, ref["kind"], ref["name"])
    # replicas in the manifest would be reset by every `kubectl apply`.
    assert "replicas" not in target["spec"], "leave replicas to the HorizontalPodAutoscaler"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    for container in pod_spec(target)["containers"]:
        assert "cpu" in container["resources"]["requests"], "CPU utilization needs a request"


# -- command lines and configuration ---------------------------------------------------


def test_every_command_line_and_environment_is_accepted_by_the_service(overlay: str) -> None:
    entrypoint = dockerfile_entrypoint()
    assert entrypoint == [ENTRYPOINT]
    checked = set()
    for container in tide_containers(overlay):
        assert container.spec.get("command") in (None, entrypoint), container.where
        service = container.service
        known = env_names(service)
        unknown = sorted(
            name
            for name in container.env()
            if name.startswith("TIDE_") and name not in known and name not in image_env()
        )
        assert not unknown, f"{container.where}: not {service} options: {unknown}"
        container.config()  # load_config + check_config, exactly as the service's main
        checked.add(service)
    assert checked == set(GRPC_SERVICE_NAMES)


def test_image_environment_names_real_options(overlay: str) -> None:
    unknown = sorted(n for n in image_env() if n.startswith("TIDE_") and n not in all_env_names())
    assert not unknown, f"deploy/Dockerfile ENV: no such options: {unknown}"


def test_config_files_set_nothing_that_flags_or_environment_override(overlay: str) -> None:
    import tomllib

    for container in tide_containers(overlay):
        config = container.config()
        # (read from a temporary copy: match the mounted file by its path's end)
        read_from = config.get_optional_str("config")
        assert read_from, f"{container.where}: no config file"
        files = container.config_files()
        [path] = [name for name in files if read_from.endswith(name)]
        keys = tomllib.loads(files[path]).keys()
        shadowed = [key for key in keys if config.sources[key] != "file"]
        role_override = container.service == "storage" and "role" in shadowed
        if role_override:  # a slave's --role SLAVE outranks the shared file on purpose
            assert config.get_str("role") == "SLAVE"
            shadowed.remove("role")
        assert not shadowed, f"{container.where}: {path} sets {shadowed}, overridden"


def test_dispatch_sidecar_shares_the_storage_volume_and_root(overlay: str) -> None:
    for sts in storage_sets(overlay):
        containers = containers_of(overlay, sts)
        assert set(containers) == {"storage", "dispatch"}
        storage, dispatch = containers["storage"].config(), containers["dispatch"].config()
        assert storage.get_str("store_dir") == dispatch.get_str("store_dir")
        port = storage.get_str("listen").rpartition(":")[2]
        assert dispatch.get_str("storage") == f"127.0.0.1:{port}"
        claim = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
        for name, cfg in (("storage", storage), ("dispatch", dispatch)):
            mounts = [
                m["mountPath"] for m in containers[name].spec["volumeMounts"] if m["name"] in claim
            ]
            assert any(cfg.get_str("store_dir").startswith(m.rstrip("/") + "/") for m in mounts), (
                f"{name}: {cfg.get_str('store_dir')} is not on the claimed volume"
            )


def nameserver_addresses(overlay: str) -> list[str]:
    nameserver = by_name(overlay, "StatefulSet", "tide-nameserver")
    [container] = [c for c in tide_containers(overlay) if c.workload is nameserver]
    port = int(container.config().get_str("listen").rpartition(":")[2])
    return [
        stable_dns(pod, nameserver["spec"]["serviceName"], container.namespace, port)
        for pod in pod_names(nameserver)
    ]


def test_storages_and_gateways_use_every_name_server(overlay: str) -> None:
    expected = nameserver_addresses(overlay)
    users = [c for c in tide_containers(overlay) if c.service in ("storage", "gateway")]
    assert users
    for container in users:
        assert container.config().get_str("namesrv").split(";") == expected, container.where


def test_broker_groups_advertise_stable_names_and_follow_their_master(overlay: str) -> None:
    groups: dict[str, dict[int, Doc]] = defaultdict(dict)
    for sts in storage_sets(overlay):
        assert sts["spec"].get("replicas", 1) == 1, "one storage per StatefulSet"
        containers = containers_of(overlay, sts)
        storage = containers["storage"]
        config = storage.config()
        dispatch_port = int(containers["dispatch"].config().get_str("listen").rpartition(":")[2])
        port = int(config.get_str("listen").rpartition(":")[2])
        service = sts["spec"]["serviceName"]
        assert config.get_str("advertise") == stable_dns(
            storage.pod, service, storage.namespace, port
        )
        assert config.get_str("dispatch_address") == stable_dns(
            storage.pod, service, storage.namespace, dispatch_port
        )
        group = pod_labels(sts)[GROUP_LABEL]
        assert config.get_str("broker_name") == group, storage.where
        broker_id = config.get_int("broker_id")
        assert broker_id not in groups[group], f"{group}: broker id {broker_id} twice"
        groups[group][broker_id] = sts
        role = config.get_str("role")
        assert pod_labels(sts)[ROLE_LABEL] == ("slave" if role == "SLAVE" else "master")
    for group, members in groups.items():
        assert 0 in members, f"{group} has no master"
        master = containers_of(overlay, members[0])["storage"]
        master_config = master.config()
        master_port = int(master_config.get_str("listen").rpartition(":")[2])
        master_address = stable_dns(
            master.pod, members[0]["spec"]["serviceName"], master.namespace, master_port
        )
        if master_config.get_str("role") == "SYNC_MASTER":
            assert len(members) > 1, f"{group}: a SYNC_MASTER without a slave refuses appends"
        for broker_id, sts in members.items():
            config = containers_of(overlay, sts)["storage"].config()
            assert config.get_int("segment_size_bytes") == master_config.get_int(
                "segment_size_bytes"
            )
            if broker_id:
                assert config.get_str("master") == master_address, sts["metadata"]["name"]


def test_termination_grace_covers_the_graceful_shutdown(overlay: str) -> None:
    for workload in workloads(overlay):
        grace = pod_spec(workload).get("terminationGracePeriodSeconds", 30)
        for container in containers_of(overlay, workload).values():
            config = container.config()
            needed = config.get_float("shutdown_grace_s") + 10
            pre_stop = container.spec.get("lifecycle", {}).get("preStop", {})
            needed += pre_stop.get("sleep", {}).get("seconds", 0)
            if container.service == "storage":
                # unregister from the name servers, then flush, checkpoint and close
                needed += config.get_int("register_timeout_ms") / 1000 + 30
            assert grace >= needed, f"{container.where}: {grace} s < {needed} s"


def test_storage_pods_roll_only_when_deleted(overlay: str) -> None:
    # Upgrades go gateways, slaves, then masters (deploy/k8s/README.md); a RollingUpdate
    # would restart every broker StatefulSet at once, master and slave of a group alike.
    for sts in storage_sets(overlay):
        assert sts["spec"]["updateStrategy"]["type"] == "OnDelete", sts["metadata"]["name"]
        retention = sts["spec"]["persistentVolumeClaimRetentionPolicy"]
        assert retention == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_cert_manager_certificate_names_every_address_of_the_cluster(overlay: str) -> None:
    """The documented cert-manager Certificate covers every host a Tide service or the
    probes connect to in the overlay: each headless Service's pods, 127.0.0.1."""
    path = K8S / "components" / "tls" / "cert-manager-certificate.yaml"
    certificate = next(
        d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Certificate"
    )
    spec = certificate["spec"]
    assert spec["secretName"] == "tide-tls"
    assert {"server auth", "client auth"} <= set(spec["usages"])
    assert "127.0.0.1" in spec["ipAddresses"]
    names = set(spec["dnsNames"])
    for service in docs(overlay, "Service"):
        name = service["metadata"]["name"]
        assert f"*.{name}.tide.svc.cluster.local" in names, name
