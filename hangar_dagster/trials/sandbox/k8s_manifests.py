"""The Kubernetes objects of one sandbox run, as pure functions of typed inputs (no cluster).

``k8s.py`` turns a ``SandboxRequest`` into a ``PodPlan`` and calls the API with what these
functions return; the tests validate every object against the Kubernetes schema
(``kubernetes-validate``, docs/operations.md) without a cluster.

The pod: one container (the ``_docker_init`` wrapper as its command) running as the command's
unprivileged uid from the start (``runAsNonRoot``, ``runAsUser``/``runAsGroup``), no privilege
escalation, every capability dropped, the RuntimeDefault seccomp profile, a read-only root
filesystem with an ``emptyDir`` at ``/tmp`` (the one place the tools write outside the
workdir: ``HOME=/tmp``) and one per bridged socket directory, no service account token, no
service environment variables, ``restartPolicy: Never``, an ``activeDeadlineSeconds`` past the
request's time limit (the cluster ends it when the run worker is gone) and memory/CPU limits
equal to their requests. Everything it sees of hangar's files (workdir, mounts, the control
directory) is a ``subPath`` of the one shared ``ReadWriteMany`` claim, read-only unless the
request made it writable: the hidden tests are a read-only mount.

The NetworkPolicy selects that pod alone (its ``hangar.sandbox`` label): no ingress, and
egress only to the run worker's bridge ports (the proxies' sockets the request mounts), or
none at all. deploy/k8s/sandbox-network.yaml adds a namespace-wide default deny for every
``hangar.managed`` pod, so a policy that failed to be created leaves the pod with no way out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MANAGED_LABEL = "hangar.managed"
SANDBOX_LABEL = "hangar.sandbox"  # the pod's own name: what its NetworkPolicy selects
OWNER_ANNOTATION = "hangar.owner"  # pod-or-host:pid:process-start of the process that made it
CONTAINER = "sandbox"
SHARED_VOLUME = "shared"
TMP_VOLUME = "tmp"
TMP_SIZE_MB = 1024  # /tmp's emptyDir: ephemeral storage, bounded
# Kubernetes' own syntax (apimachinery validation): label values and DNS-1123 names.
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Bind:
    """A path of the shared claim (``sub_path``, relative to its root) at ``mount_path``."""

    sub_path: str
    mount_path: str
    read_only: bool = True


@dataclass(frozen=True)
class PodPlan:
    name: str
    namespace: str
    image: str
    command: list[str]
    uid: int
    gid: int
    claim: str  # the shared ReadWriteMany PersistentVolumeClaim
    binds: tuple[Bind, ...]
    scratch: tuple[str, ...] = ()  # empty writable directories besides /tmp (bridged sockets)
    memory_mb: int = 4096  # the container's limit (and request)
    cpus: float | None = None
    active_deadline_s: int = 3600
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Peer:
    """Where a sandbox may connect: pods matching ``labels`` in ``namespace``, on ``ports``."""

    namespace: str
    labels: Mapping[str, str]
    ports: tuple[int, ...]


def label_value(text: str) -> str:
    """``text`` as a valid label value: other characters become '-', at most 63, alphanumeric
    at both ends (the original goes in an annotation)."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def is_label_value(text: str) -> bool:
    return len(text) <= 63 and bool(_LABEL_VALUE.match(text))


def is_dns_label(text: str) -> bool:
    return len(text) <= 63 and bool(_DNS_1123_LABEL.match(text))


def sandbox_labels(name: str, extra: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) of a sandbox pod: ``extra`` (experiment, trial) sanitized as
    labels and kept whole as annotations, then the managed and sandbox labels."""
    labels = {k: label_value(v) for k, v in extra.items()}
    labels.update({MANAGED_LABEL: "1", SANDBOX_LABEL: name})
    return labels, dict(extra)


def _volume_name(i: int) -> str:
    return f"scratch-{i}"


def pod_manifest(plan: PodPlan) -> dict[str, Any]:
    """The Pod of ``plan``: see the module's docstring for what each field is for."""
    if not is_dns_label(plan.name):
        raise ValueError(f"pod name {plan.name!r}: must be a DNS-1123 label")
    if plan.uid <= 0 or plan.gid <= 0:
        raise ValueError(f"pod uid/gid {plan.uid}/{plan.gid}: must be an unprivileged user")
    mounts: list[dict[str, Any]] = [
        {
            "name": SHARED_VOLUME,
            "mountPath": b.mount_path,
            "subPath": b.sub_path,
            "readOnly": b.read_only,
        }
        for b in plan.binds
    ]
    mounts.append({"name": TMP_VOLUME, "mountPath": "/tmp"})
    mounts += [{"name": _volume_name(i), "mountPath": p} for i, p in enumerate(plan.scratch)]
    volumes: list[dict[str, Any]] = [
        {"name": SHARED_VOLUME, "persistentVolumeClaim": {"claimName": plan.claim}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": f"{TMP_SIZE_MB}Mi"}},
    ]
    volumes += [{"name": _volume_name(i), "emptyDir": {}} for i in range(len(plan.scratch))]
    amounts: dict[str, str] = {"memory": f"{plan.memory_mb}Mi"}
    if plan.cpus:
        amounts["cpu"] = f"{math.ceil(plan.cpus * 1000)}m"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": dict(plan.labels),
            "annotations": dict(plan.annotations),
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": plan.active_deadline_s,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": plan.uid,
                "runAsGroup": plan.gid,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": plan.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": plan.command[:1],
                    "args": plan.command[1:],
                    "workingDir": "/",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": plan.uid,
                        "runAsGroup": plan.gid,
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {"limits": dict(amounts), "requests": dict(amounts)},
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


def network_policy(
    name: str, namespace: str, labels: Mapping[str, str], peer: Peer | None
) -> dict[str, Any]:
    """The NetworkPolicy of sandbox pod ``name``: no ingress; egress to ``peer`` only (None:
    no egress at all)."""
    egress: list[dict[str, Any]] = []
    if peer is not None and peer.ports:
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": peer.namespace}
                        },
                        "podSelector": {"matchLabels": dict(peer.labels)},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": p} for p in sorted(peer.ports)],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX_LABEL: name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def peer_labels(own: Mapping[str, str]) -> dict[str, str]:
    """How a sandbox's policy selects the run worker's pod: by ``dagster/run-id`` (the label
    K8sRunLauncher gives each run's pod, so this one alone) when it has one, else by all of its
    labels."""
    if "dagster/run-id" in own:
        return {"dagster/run-id": own["dagster/run-id"]}
    if not own:
        # An empty selector would be every pod of the namespace.
        raise ValueError("hangar's own pod has no labels to select it by")
    return dict(own)
