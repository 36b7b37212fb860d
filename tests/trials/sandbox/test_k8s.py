"""The Kubernetes sandbox without a cluster: its manifests against the Kubernetes schema, and its
API calls against a STAND-IN API server at the HTTP level (tests/k8sfake.py) through the real
``kubernetes`` client. What no test here runs: a real API server, kubelet, scheduler, CNI or
volume (docs/operations.md, "Kubernetes")."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from hangar_dagster.trials.sandbox import (
    K8sPlacement,
    Mount,
    RunAs,
    SandboxRequest,
    SandboxRuntime,
    SandboxUnavailable,
    get_sandbox,
    k8s,
)
from hangar_dagster.trials.sandbox._container import CONTROL, DEFAULT_UID
from hangar_dagster.trials.sandbox.k8s_manifests import (
    MANAGED_LABEL,
    OWNER_ANNOTATION,
    SANDBOX_LABEL,
    Peer,
    is_dns_label,
    is_label_value,
    label_value,
    network_policy,
    pod_manifest,
)
from tests.k8sfake import FakeCluster, ScriptedKubelet, control_dir, validate

pytestmark = pytest.mark.unit

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
IMAGE = "registry.example/hangar-dagster@sha256:" + "a" * 64
CLAIM = "hangar-shared"
EXPERIMENT = {"hangar.experiment": "skills_ab_1a2b3c4d", "hangar.trial": "skill/median/0"}


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    for d in ("home/work/wd", "home/hidden", "home/out", "tmp"):
        (root / d).mkdir(parents=True)
    (root / "home/hidden/test_hidden.py").write_text("def test_x(): pass\n")
    return root


def request(shared: Path, **kw: Any) -> SandboxRequest:
    fields: dict[str, Any] = {
        "argv": ["/bin/sh", "-c", "echo hi"],
        "workdir": shared / "home/work/wd",
        "env": ENV,
        "timeout_s": 30,
        "memory_mb": 512,
        "mounts": [
            Mount(shared / "home/hidden", "/hidden"),
            Mount(shared / "home/out", "/out", writable=True),
        ],
    }
    return SandboxRequest(**(fields | kw))


def plan(
    shared: Path, req: SandboxRequest, uid: int = DEFAULT_UID, scratch: tuple[str, ...] = ()
) -> dict[str, Any]:
    control = shared / "tmp" / "hangar-k8s-x"
    control.mkdir(exist_ok=True)
    binds, _ = k8s.socket_dirs(req.mounts)
    return pod_manifest(
        k8s.pod_plan(
            req, name="hangar-sbx-0123456789ab", namespace="hangar", image=IMAGE, claim=CLAIM,
            root=shared, control=control, uid=uid, gid=uid, binds=binds, scratch=scratch,
            labels={MANAGED_LABEL: "1", SANDBOX_LABEL: "hangar-sbx-0123456789ab"},
            annotations={},
        )
    )  # fmt: skip


# --- the manifests, against the schema ------------------------------------------------------


def test_a_trial_pod_validates_and_is_locked_down(shared: Path) -> None:
    pod = plan(shared, request(shared))
    validate(pod)
    spec = pod["spec"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == DEFAULT_UID == sc["runAsUser"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False and spec["hostNetwork"] is False
    assert spec["restartPolicy"] == "Never"
    # The cluster's backstop is past the command's own limit.
    assert spec["activeDeadlineSeconds"] > 30
    assert c["resources"]["limits"]["memory"] == "640Mi" == c["resources"]["requests"]["memory"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/hidden"]["readOnly"] is True and mounts["/hidden"]["subPath"] == "home/hidden"
    assert mounts["/out"]["readOnly"] is False
    wd = str(shared / "home/work/wd")
    assert mounts[wd] == {"name": "shared", "mountPath": wd, "subPath": "home/work/wd",
                          "readOnly": False}  # fmt: skip
    assert mounts[CONTROL]["subPath"] == "tmp/hangar-k8s-x"
    # The one writable place outside what the request mounts: /tmp, an emptyDir.
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["sizeLimit"] == "1024Mi"
    assert volumes["shared"] == {"name": "shared", "persistentVolumeClaim": {"claimName": CLAIM}}
    # The command's environment travels in setup.json, not in the pod spec anyone may read.
    assert "env" not in c
    assert c["command"][1:] == [] and c["args"][:3] == ["-I", "-S", "-c"]


def test_a_grade_pod_runs_as_the_graders_own_uid(shared: Path) -> None:
    req = request(shared, run_as=RunAs(1_512_345_678, 1_512_345_678), cpus=1.5)
    pod = plan(shared, req, uid=1_512_345_678)
    validate(pod)
    assert pod["spec"]["securityContext"]["runAsUser"] == 1_512_345_678
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1500m"


def test_the_schema_check_can_fail(shared: Path) -> None:
    pod = plan(shared, request(shared))
    pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod)


def test_network_policies_validate_deny_all_and_allow_only_the_bridges() -> None:
    labels = {MANAGED_LABEL: "1", SANDBOX_LABEL: "hangar-sbx-1"}
    sealed = network_policy("hangar-sbx-1", "hangar", labels, None)
    validate(sealed)
    assert sealed["spec"]["podSelector"] == {"matchLabels": {SANDBOX_LABEL: "hangar-sbx-1"}}
    assert sealed["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert sealed["spec"]["ingress"] == [] and sealed["spec"]["egress"] == []
    peer = Peer("hangar", {"dagster/run-id": "3f2a"}, (41000, 40999))
    bridged = network_policy("hangar-sbx-1", "hangar", labels, peer)
    validate(bridged)
    (rule,) = bridged["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 40999}, {"protocol": "TCP", "port": 41000}]
    (to,) = rule["to"]
    assert to["podSelector"] == {"matchLabels": {"dagster/run-id": "3f2a"}}
    assert to["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "hangar"}}


@pytest.mark.parametrize(
    "text", ["skill/median/0", "a" * 80, "--x--", "/", "ünïcode trial", "v1.2_x-", ""]
)
def test_label_values_are_always_valid(text: str) -> None:
    assert is_label_value(label_value(text))


def test_names_and_bind_sources_are_checked(shared: Path, tmp_path: Path) -> None:
    assert is_dns_label("hangar-sbx-0123456789ab") and not is_dns_label("Hangar_sbx")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    req = request(shared, mounts=[Mount(outside, "/x")])
    with pytest.raises(SandboxUnavailable, match="outside the shared volume"):
        plan(shared, req)


def test_a_directory_of_sockets_is_bridged_and_a_mixed_one_refused(shared: Path) -> None:
    socks = shared / "tmp" / "egress"
    socks.mkdir()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(socks / "proxy.sock"))
        req = request(shared, mounts=[Mount(socks, "/hangar-egress"), *request(shared).mounts])
        binds, bridged = k8s.socket_dirs(req.mounts)
        assert [m.target for m in binds] == ["/hidden", "/out"]
        assert [(m.target, names) for m, names in bridged] == [("/hangar-egress", ["proxy.sock"])]
        pod = plan(shared, req, scratch=("/hangar-egress",))
        validate(pod)
        mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert "subPath" not in mounts["/hangar-egress"]  # an emptyDir the wrapper fills
        (socks / "stray.txt").write_text("x")
        with pytest.raises(SandboxUnavailable, match="sockets and other files"):
            k8s.socket_dirs(req.mounts)


# --- the API calls, against the stand-in API server -----------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    fake = FakeCluster()
    fake.start()
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for cached in (k8s.api_client, k8s.server_version, k8s._own_pod):
        cached.cache_clear()
    yield fake
    fake.stop()
    for cached in (k8s.api_client, k8s.server_version, k8s._own_pod):
        cached.cache_clear()


def runtime(shared: Path, pod_name: str = "") -> SandboxRuntime:
    placement = K8sPlacement("hangar", CLAIM, shared, pod_name)
    return SandboxRuntime(in_image=True, image=IMAGE, shared=(shared,), k8s=placement)


@pytest.fixture
def on_shared(shared: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR on the claim, as the deployment sets it (control directories land there)."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(shared / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return shared


def test_a_run_creates_the_policy_first_and_leaves_nothing(
    cluster: FakeCluster, on_shared: Path
) -> None:
    kubelet = ScriptedKubelet(on_shared, exit_code=3, writes={"out": b"hello\n", "err": b"oops\n"})
    cluster.kubelet = kubelet
    sandbox = get_sandbox("k8s", image=IMAGE, labels=EXPERIMENT, runtime=runtime(on_shared))
    res = sandbox.run(request(on_shared))
    assert (res.exit_code, res.timed_out, res.stdout, res.stderr) == (3, False, "hello\n", "oops\n")
    creates = [p.rsplit("/", 1)[1] for m, p in cluster.requests if m == "POST"]
    assert creates == ["networkpolicies", "pods"]  # the policy before the pod
    assert cluster.pods == {} and cluster.policies == {}
    deletes = {p.rsplit("/", 2)[1] for m, p in cluster.requests if m == "DELETE"}
    assert deletes == {"pods", "networkpolicies"}
    (setup,) = kubelet.seen_setup
    assert setup["argv"] == ["/bin/sh", "-c", "echo hi"] and setup["env"]["PATH"] == ENV["PATH"]
    assert setup["uid"] == (DEFAULT_UID if os.geteuid() == 0 else os.geteuid())
    assert setup["bridges"] == []
    assert sandbox.describe() == {"backend": "k8s", "version": "kubernetes v1.32.0-fake",
                                  "isolation": "namespaces", "image": IMAGE}  # fmt: skip


def test_labels_find_a_sandbox_and_the_policy_selects_it_alone(
    cluster: FakeCluster, on_shared: Path
) -> None:
    seen: dict[str, Any] = {}

    class Peek(ScriptedKubelet):
        def start(self, c: FakeCluster, pod: dict[str, Any]) -> None:
            seen["pod"], seen["policies"] = pod, dict(c.policies)
            super().start(c, pod)

    cluster.kubelet = Peek(on_shared)
    sandbox = get_sandbox("k8s", image=IMAGE, labels=EXPERIMENT, runtime=runtime(on_shared))
    assert sandbox.run(request(on_shared)).exit_code == 0
    meta = seen["pod"]["metadata"]
    assert meta["labels"]["hangar.trial"] == "skill-median-0"  # a label value cannot hold '/'
    assert meta["annotations"]["hangar.trial"] == "skill/median/0"
    assert meta["labels"][MANAGED_LABEL] == "1"
    assert meta["annotations"][OWNER_ANNOTATION].startswith(f"host/{socket.gethostname()}:")
    (policy,) = seen["policies"].values()
    assert policy["spec"]["podSelector"]["matchLabels"] == {SANDBOX_LABEL: meta["name"]}
    assert policy["spec"]["egress"] == []


def test_the_time_limit_deletes_the_pod(cluster: FakeCluster, on_shared: Path) -> None:
    cluster.kubelet = ScriptedKubelet(on_shared, run_s=None, writes={"out": b"started\n"})
    sandbox = get_sandbox("k8s", runtime=runtime(on_shared))
    res = sandbox.run(request(on_shared, timeout_s=0.5))
    assert (res.exit_code, res.timed_out, res.cancelled) == (None, True, False)
    assert res.stdout == "started\n" and cluster.pods == {}


def test_cancel_stops_the_pod(cluster: FakeCluster, on_shared: Path) -> None:
    cluster.kubelet = ScriptedKubelet(on_shared, run_s=None)
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    res = get_sandbox("k8s", runtime=runtime(on_shared)).run(request(on_shared, cancel=cancel))
    assert (res.cancelled, res.timed_out, res.exit_code) == (True, False, None)
    assert cluster.pods == {}


def test_a_pod_that_cannot_pull_its_image_is_unavailable(
    cluster: FakeCluster, on_shared: Path
) -> None:
    cluster.kubelet = ScriptedKubelet(on_shared, waiting="ImagePullBackOff")
    with pytest.raises(SandboxUnavailable, match="cannot start: ImagePullBackOff"):
        get_sandbox("k8s", runtime=runtime(on_shared)).run(request(on_shared))
    assert cluster.pods == {} and cluster.policies == {}


def test_a_refused_pod_is_unavailable_and_its_policy_removed(
    cluster: FakeCluster, on_shared: Path
) -> None:
    cluster.refuse["POST pods"] = 403
    with pytest.raises(SandboxUnavailable, match=r"creating sandbox pod .*\(403"):
        get_sandbox("k8s", runtime=runtime(on_shared)).run(request(on_shared))
    assert cluster.policies == {}


def test_what_the_backend_needs_is_named(shared: Path) -> None:
    host = SandboxRuntime(image=IMAGE, k8s=K8sPlacement("hangar", CLAIM, shared))
    with pytest.raises(SandboxUnavailable, match="HANGAR_SANDBOX_RUNTIME=image"):
        get_sandbox("k8s", runtime=host).run(request(shared))
    no_claim = SandboxRuntime(in_image=True, image=IMAGE)
    with pytest.raises(SandboxUnavailable, match="HANGAR_K8S_SHARED_CLAIM"):
        get_sandbox("k8s", runtime=no_claim).run(request(shared))


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"echo:" + self.request.recv(100))


def test_a_bridged_socket_reaches_only_the_run_workers_port_from_the_pods_ip(
    cluster: FakeCluster, on_shared: Path
) -> None:
    socks = on_shared / "tmp" / "egress"
    socks.mkdir()
    server = socketserver.ThreadingUnixStreamServer(str(socks / "proxy.sock"), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cluster.add_pod("run-worker-0", {"dagster/run-id": "3f2a", "app": "x"}, ip="127.0.0.1")
    answers: list[bytes] = []

    class Client(ScriptedKubelet):
        """Stands in for the wrapper's side: connects to the port setup.json names."""

        def start(self, c: FakeCluster, pod: dict[str, Any]) -> None:
            setup = json.loads((control_dir(pod, self.shared_root) / "setup.json").read_text())
            ((path, host, port),) = setup["bridges"]
            assert (path, host) == ("/hangar-egress/proxy.sock", "127.0.0.1")
            c.set_state(pod["metadata"]["name"], "Running", {"running": {}}, pod_ip="127.0.0.1")
            time.sleep(0.3)  # the backend's poll saw the pod's IP
            with socket.create_connection((host, port), source_address=("127.0.0.2", 0)) as o:
                o.sendall(b"x")  # from another address: closed unanswered
                try:
                    answers.append(o.recv(100))
                except ConnectionResetError:
                    answers.append(b"")
            with socket.create_connection((host, port)) as s:
                s.sendall(b"hi")
                answers.append(s.recv(100))
            self.seen_setup.append(dict(c.policies))
            c.set_state(pod["metadata"]["name"], "Succeeded", {"terminated": {"exitCode": 0}})

    kubelet = Client(on_shared)
    cluster.kubelet = kubelet
    req = request(on_shared, mounts=[Mount(socks, "/hangar-egress")])
    res = get_sandbox("k8s", runtime=runtime(on_shared, "run-worker-0")).run(req)
    server.shutdown()
    server.server_close()
    assert res.exit_code == 0
    assert answers == [b"", b"echo:hi"]
    (policy,) = kubelet.seen_setup[0].values()
    (rule,) = policy["spec"]["egress"]
    assert rule["to"][0]["podSelector"] == {"matchLabels": {"dagster/run-id": "3f2a"}}
    assert len(rule["ports"]) == 1


def test_leftovers_of_gone_owners_are_removed_and_live_ones_kept(
    cluster: FakeCluster, shared: Path
) -> None:
    me = socket.gethostname()
    start = k8s._process_start(os.getpid())
    owners = {
        "mine-live": f"host/{me}:{os.getpid()}:{start}",
        "mine-dead": f"host/{me}:999999999:1",
        "gone-pod": "pod/run-worker-gone:7:1",
        "live-pod": "pod/run-worker-live:7:1",
        "other-host": "host/workstation-9:7:1",
    }
    cluster.add_pod("run-worker-live", {"dagster/run-id": "b"})
    for name, who in owners.items():
        cluster.pods[name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "hangar", "labels": {MANAGED_LABEL: "1"},
                         "annotations": {OWNER_ANNOTATION: who}},
            "spec": {"containers": [{"name": "sandbox", "image": IMAGE}]},
            "status": {"phase": "Running"},
        }  # fmt: skip
        cluster.policies[name] = network_policy(name, "hangar", {MANAGED_LABEL: "1"}, None)
    cluster.policies["orphan"] = network_policy("orphan", "hangar", {MANAGED_LABEL: "1"}, None)
    removed = k8s.cleanup_leftovers(K8sPlacement("hangar", CLAIM, shared))
    assert removed == 2
    assert set(cluster.pods) == {"mine-live", "live-pod", "other-host", "run-worker-live"}
    assert set(cluster.policies) == {"mine-live", "live-pod", "other-host"}
