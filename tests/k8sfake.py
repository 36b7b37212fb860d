"""A STAND-IN for a Kubernetes cluster, for the tests of the Kubernetes sandbox (no cluster is
reachable from here).

``FakeCluster`` answers the few REST calls hangar's backend makes, at the HTTP level, so the
real ``kubernetes`` client (its serialization, its errors) is what the backend talks to: pods
and NetworkPolicies (create, read, list by equality label selector, delete) and ``/version``.
Every object it is asked to create is first validated against the Kubernetes schema
(kubernetes-validate, ``K8S_VERSION``, strict: an unknown field is an error) and refused with a
422 like an API server would. What it is not: admission, scheduling, NetworkPolicy enforcement,
volumes, quota. A "kubelet" decides what happens to a created pod:

- ``ScriptedKubelet``: writes given bytes into the wrapper's output files (found through the
  pod's control ``subPath``) and reports an exit code, or stays running, or never starts;
- ``DockerKubelet`` (in ``tests/deploy/test_k8s_pod_under_docker.py``) runs the pod's container
  spec under Docker.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import yaml

from hangar_dagster.trials.sandbox._container import CONTROL

# The Kubernetes version every generated manifest and deploy/k8s file is validated against
# (kubernetes-validate's bundled schema, strict). docs/operations.md names it.
K8S_VERSION = "1.32.0"


def validate(obj: dict[str, Any]) -> None:
    """Raise kubernetes_validate.ValidationError if ``obj`` is not a valid object of its kind."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def control_dir(pod: dict[str, Any], shared_root: Path) -> Path:
    """Where the pod's control directory lies on this host (its subPath of the claim)."""
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == CONTROL]
    return shared_root / mount["subPath"]


def terminated(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}


class Kubelet:
    """What happens to a pod once created: ``start`` runs in a thread of its own."""

    def start(self, cluster: FakeCluster, pod: dict[str, Any]) -> None:
        raise NotImplementedError

    def stop(self, pod: dict[str, Any]) -> None:
        """The pod was deleted: stop what runs it."""


@dataclass
class ScriptedKubelet(Kubelet):
    """Write ``writes`` ({"out": bytes, "err": bytes}) into the control files and end with
    ``exit_code``; ``run_s`` None: stay running until deleted; ``waiting``: never start."""

    shared_root: Path
    exit_code: int = 0
    writes: dict[str, bytes] = field(default_factory=dict)
    run_s: float | None = 0.0
    waiting: str | None = None
    seen_setup: list[dict[str, Any]] = field(default_factory=list)

    def start(self, cluster: FakeCluster, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if self.waiting is not None:
            cluster.set_state(name, "Pending", {"waiting": {"reason": self.waiting}})
            return
        control = control_dir(pod, self.shared_root)
        self.seen_setup.append(json.loads((control / "setup.json").read_text()))
        cluster.set_state(name, "Running", {"running": {}}, pod_ip="127.0.0.1")
        for file, data in self.writes.items():
            with (control / file).open("ab") as f:
                f.write(data)
        if self.run_s is None:
            return
        time.sleep(self.run_s)
        phase = "Succeeded" if self.exit_code == 0 else "Failed"
        cluster.set_state(name, phase, terminated(self.exit_code))


class FakeCluster:
    """The stand-in API server; ``url`` once started; ``requests`` logs (method, path)."""

    def __init__(self, kubelet: Kubelet | None = None, namespace: str = "hangar") -> None:
        self.kubelet = kubelet
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.refuse: dict[str, int] = {}  # "POST pods" -> status: answer with it instead
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- the cluster's state ----------------------------------------------------------------

    def add_pod(
        self, name: str, labels: dict[str, str], phase: str = "Running", ip: str = ""
    ) -> None:
        """A pod that is not a sandbox (hangar's own, another run worker's)."""
        self.pods[name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "hangar"}]},
            "status": {"phase": phase, **({"podIP": ip} if ip else {})},
        }

    def set_state(
        self, name: str, phase: str, state: dict[str, Any], pod_ip: str | None = None
    ) -> None:
        with self.lock:
            pod = self.pods.get(name)
            if pod is None:
                return  # deleted meanwhile
            container = pod["spec"]["containers"][0]
            status: dict[str, Any] = {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": phase == "Running",
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            }
            if pod_ip or pod["status"].get("podIP"):
                status["podIP"] = pod_ip or pod["status"]["podIP"]
            pod["status"] = status

    # --- serving ----------------------------------------------------------------------------

    def start(self) -> str:
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                cluster._handle(self, "GET")

            def do_POST(self) -> None:
                cluster._handle(self, "POST")

            def do_DELETE(self) -> None:
                cluster._handle(self, "DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def kubeconfig(self, path: Path, url: str | None = None) -> Path:
        """A kubeconfig naming this server (no credentials: the stand-in asks for none)."""
        server = url or self.url
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": server}}],
                    "users": [{"name": "fake", "user": {}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {
                                "cluster": "fake",
                                "user": "fake",
                                "namespace": self.namespace,
                            },
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        segments = [s for s in parts.path.split("/") if s]
        self.requests.append((method, parts.path))
        body: Any = None
        if method == "POST":
            length = int(h.headers.get("Content-Length") or 0)
            body = json.loads(h.rfile.read(length) or b"{}")
        status, answer = self._route(method, segments, parse_qs(parts.query), body)
        data = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(
        self, method: str, seg: list[str], query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        if seg in (["version"],):
            return 200, {
                "major": "1", "minor": "32", "gitVersion": "v1.32.0-fake", "gitCommit": "0" * 40,
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64",
            }  # fmt: skip
        if seg[:2] == ["api", "v1"] and seg[2:3] == ["namespaces"] and seg[4:5] == ["pods"]:
            return self._objects(method, "pods", self.pods, seg[3], seg[5:], query, body)
        if seg[:3] == ["apis", "networking.k8s.io", "v1"] and seg[5:6] == ["networkpolicies"]:
            return self._objects(
                method, "networkpolicies", self.policies, seg[4], seg[6:], query, body
            )
        return 404, _status(404, "NotFound", f"no route {'/'.join(seg)}")

    def _objects(
        self,
        method: str,
        kind: str,
        store: dict[str, dict[str, Any]],
        namespace: str,
        rest: list[str],
        query: dict[str, list[str]],
        body: Any,
    ) -> tuple[int, Any]:
        if (refused := self.refuse.get(f"{method} {kind}")) is not None:
            return refused, _status(refused, "Forbidden", f"{method} {kind} refused (scripted)")
        if namespace != self.namespace:
            return 404, _status(404, "NotFound", f"namespace {namespace}")
        if not rest and method == "GET":
            selector = dict(
                pair.split("=", 1)
                for pair in (query.get("labelSelector") or [""])[0].split(",")
                if pair
            )
            with self.lock:
                items = [
                    o
                    for o in store.values()
                    if selector.items() <= (o["metadata"].get("labels") or {}).items()
                ]
            kind_name = "PodList" if kind == "pods" else "NetworkPolicyList"
            return 200, {"apiVersion": "v1", "kind": kind_name, "metadata": {}, "items": items}
        if not rest and method == "POST":
            try:
                validate(body)
            except kubernetes_validate.ValidationError as err:
                return 422, _status(422, "Invalid", f"{err.message} at {list(err.path)}")
            name = body["metadata"]["name"]
            with self.lock:
                if name in store:
                    return 409, _status(409, "AlreadyExists", f"{kind} {name} exists")
                obj = json.loads(json.dumps(body))
                obj["metadata"]["uid"] = str(uuid.uuid4())
                obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
                if kind == "pods":
                    obj["status"] = {"phase": "Pending"}
                store[name] = obj
            if kind == "pods" and self.kubelet is not None:
                threading.Thread(target=self.kubelet.start, args=(self, obj), daemon=True).start()
            return 201, obj
        if len(rest) == 1:
            with self.lock:
                obj = store.get(rest[0])
                if obj is not None and method == "DELETE":
                    del store[rest[0]]
            if obj is None:
                return 404, _status(404, "NotFound", f"{kind} {rest[0]} not found")
            if method == "DELETE" and kind == "pods" and self.kubelet is not None:
                self.kubelet.stop(obj)
            return 200, obj
        return 405, _status(405, "MethodNotAllowed", f"{method} {kind}")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
