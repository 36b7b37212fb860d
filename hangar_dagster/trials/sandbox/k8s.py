"""The Kubernetes backend: one pod per request, through the Kubernetes API.

Chosen by ``environment.sandbox: k8s``. hangar runs in a pod of the project image (a run
worker K8sRunLauncher started, deploy/k8s) with ``HANGAR_SANDBOX_RUNTIME=image`` and the
shared ``ReadWriteMany`` claim (``HANGAR_K8S_SHARED_CLAIM``) mounted at
``HANGAR_K8S_SHARED_PATH``; ``HANGAR_HOME`` and ``TMPDIR`` lie under it. Each ``run``:

1. writes the wrapper's setup into a control directory under ``TMPDIR`` (``_container``: the
   same ``_docker_init`` wrapper and files as the Docker backend), handing the workdir to the
   command's uid as Docker does (the uid split: ``run_as`` for the grader, else
   ``DEFAULT_UID`` when hangar is root);
2. creates the pod's NetworkPolicy, then the pod (``k8s_manifests``: pure functions, validated
   against the Kubernetes schema in the tests): every path it sees is a ``subPath`` of the
   claim at the path the request names (the hidden tests read-only);
3. follows the wrapper's output files while it polls the pod's status; at the time limit (from
   when the pod runs: image pulls and scheduling do not eat the command's time) or on cancel it
   deletes the pod; a pod that cannot start (image pull, bad config, not scheduled within
   ``START_TIMEOUT_S``) is ``SandboxUnavailable``;
4. deletes the pod and its policy whatever happened.

Unix sockets the request mounts (the model proxy's and the egress proxy's directories) cannot
cross nodes, so they are bridged: the wrapper listens on a socket of the same name in an
``emptyDir`` at the mount's path and relays each connection over TCP to a port this process
opened for it, which relays to the real socket. The pod's NetworkPolicy allows egress to those
ports of hangar's own pod alone (selected by its ``dagster/run-id`` label), and the ports accept
connections only from the sandbox pod's IP. With no socket to bridge, the policy allows no
egress at all.

What this backend trusts of the cluster: that it enforces NetworkPolicy (a CNI such as Calico
or Cilium; without one the pod's network is open) and the pod security fields. What it does
not have, that Docker has: a per-container process limit (the kubelet's ``podPidsLimit``
bounds it) and a control directory the command cannot write (the wrapper runs as the
command's uid: it may write its own output files, nothing more).
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangar_dagster.trials.forwarder import relay
from hangar_dagster.trials.sandbox import (
    K8sPlacement,
    Mount,
    Sandbox,
    SandboxRequest,
    SandboxResult,
    SandboxUnavailable,
)
from hangar_dagster.trials.sandbox._common import check_request
from hangar_dagster.trials.sandbox._container import (
    CONTROL,
    INIT_SOURCE,
    MEMORY_HEADROOM_MB,
    SELF_DEADLINE_S,
    command_user,
    hand_back,
    hand_over,
    hand_to_command,
    stop_tails,
    tails,
    write_setup,
)
from hangar_dagster.trials.sandbox.k8s_manifests import (
    MANAGED_LABEL,
    OWNER_ANNOTATION,
    SANDBOX_LABEL,
    Bind,
    Peer,
    PodPlan,
    network_policy,
    peer_labels,
    pod_manifest,
    sandbox_labels,
)

START_TIMEOUT_S = 300.0  # from creation until the pod runs (pull, schedule)
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# A container waiting for one of these will not start by itself.
_CANNOT_START = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}
_POLL_MIN_S, _POLL_MAX_S = 0.05, 0.5


@functools.cache
def api_client() -> Any:
    """The Kubernetes API (in a pod: its service account; else ``KUBECONFIG``), or
    SandboxUnavailable saying why."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            # The client's own variable, read now: the library reads it once, at import.
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
            )
    except config.ConfigException as err:
        raise SandboxUnavailable(
            f"no Kubernetes API to talk to ({err}): run hangar in a pod of the cluster "
            "(deploy/k8s) or point KUBECONFIG at it"
        ) from None
    return client.ApiClient(configuration)


def _core() -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client())


def _net() -> Any:
    from kubernetes import client

    return client.NetworkingV1Api(api_client())


def _api_error(action: str, err: Exception) -> SandboxUnavailable:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None) or str(err)
    return SandboxUnavailable(f"Kubernetes {action} failed ({status or 'no answer'}: {reason})")


@functools.cache
def server_version() -> str:
    from kubernetes import client

    try:
        return str(client.VersionApi(api_client()).get_code().git_version)
    except Exception as err:  # noqa: BLE001  any failure: the API is not usable
        raise _api_error("version lookup", err) from None


def namespace(placement: K8sPlacement) -> str:
    if placement.namespace:
        return placement.namespace
    try:
        return _SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _own_name(placement: K8sPlacement) -> str:
    return placement.pod_name or socket.gethostname()


def _process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner(placement: K8sPlacement) -> str:
    """Who made a pod: ``pod/<name>`` (hangar in a pod) or ``host/<name>``, pid, process start."""
    kind = "pod" if os.environ.get("KUBERNETES_SERVICE_HOST") else "host"
    pid = os.getpid()
    return f"{kind}/{_own_name(placement)}:{pid}:{_process_start(pid)}"


@dataclass(frozen=True)
class OwnPod:
    name: str
    namespace: str
    labels: dict[str, str]
    ip: str


@functools.cache
def _own_pod(name: str, ns: str) -> OwnPod:
    """hangar's own pod, which the bridged sockets' policy selects and the sandbox connects to."""
    try:
        pod = _core().read_namespaced_pod(name, ns)
    except Exception as err:  # noqa: BLE001
        raise SandboxUnavailable(
            f"bridging a socket needs hangar's own pod {ns}/{name} "
            f"({_api_error('pod lookup', err)}): run hangar in a pod, or set "
            "HANGAR_K8S_POD_NAME and HANGAR_K8S_NAMESPACE to it"
        ) from None
    ip = pod.status.pod_ip if pod.status else None
    if not ip:
        raise SandboxUnavailable(f"hangar's own pod {ns}/{name} has no IP yet")
    return OwnPod(name, ns, dict(pod.metadata.labels or {}), str(ip))


# --- bridged sockets ------------------------------------------------------------------------


def socket_dirs(mounts: Sequence[Mount]) -> tuple[list[Mount], list[tuple[Mount, list[str]]]]:
    """(mounts bound from the claim, (socket directory, its sockets) to bridge)."""
    binds: list[Mount] = []
    bridged: list[tuple[Mount, list[str]]] = []
    for m in mounts:
        entries = sorted(m.source.iterdir()) if m.source.is_dir() else []
        sockets = [e.name for e in entries if stat.S_ISSOCK(e.lstat().st_mode)]
        if not sockets:
            binds.append(m)
            continue
        if len(sockets) != len(entries):
            raise SandboxUnavailable(
                f"mount {m.source}: holds unix sockets and other files; the Kubernetes backend "
                "bridges a directory of sockets only"
            )
        bridged.append((m, sockets))
    return binds, bridged


class _Bridge:
    """A TCP port of this pod relaying to one unix socket, for connections from one IP only."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.allowed: str | None = None  # the sandbox pod's IP, once it has one
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("0.0.0.0", 0))  # noqa: S104  the pod's IP: sandboxes on other nodes
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, address = self.listener.accept()
            except OSError:
                return
            if self.allowed is None or address[0] != self.allowed:
                client.close()
                continue
            threading.Thread(
                target=relay, args=(client, str(self.socket_path)), daemon=True
            ).start()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


# --- the backend ----------------------------------------------------------------------------


def _sub_path(source: Path, root: Path) -> str:
    resolved = source.resolve()
    if not resolved.is_relative_to(root):
        raise SandboxUnavailable(
            f"bind source {source} is outside the shared volume at {root} "
            "(HANGAR_K8S_SHARED_PATH): a pod sees only that claim. Keep HANGAR_HOME and "
            "TMPDIR under it, and the mounts under them"
        )
    rel = resolved.relative_to(root).as_posix()
    return "" if rel == "." else rel


def pod_plan(
    request: SandboxRequest,
    *,
    name: str,
    namespace: str,
    image: str,
    claim: str,
    root: Path,
    control: Path,
    uid: int,
    gid: int,
    binds: Sequence[Mount],
    scratch: Sequence[str],
    labels: dict[str, str],
    annotations: dict[str, str],
) -> PodPlan:
    """The pod of ``request``: the control directory, the workdir and each bound mount as
    subPaths of the claim (read-only unless writable), the bridged socket dirs empty."""
    volume_binds = [
        Bind(_sub_path(control, root), CONTROL, read_only=False),
        Bind(_sub_path(request.workdir, root), str(request.workdir), read_only=False),
        *(Bind(_sub_path(m.source, root), m.target, read_only=not m.writable) for m in binds),
    ]
    return PodPlan(
        name=name,
        namespace=namespace,
        image=image,
        command=[sys.executable, "-I", "-S", "-c", INIT_SOURCE, f"{CONTROL}/setup.json"],
        uid=uid,
        gid=gid,
        claim=claim,
        binds=tuple(volume_binds),
        scratch=tuple(scratch),
        memory_mb=request.memory_mb + MEMORY_HEADROOM_MB,
        cpus=request.cpus,
        # The cluster's own backstop when this process is gone: start, run, and the wrapper's
        # own deadline past the limit.
        active_deadline_s=int(START_TIMEOUT_S + math.ceil(request.timeout_s) + SELF_DEADLINE_S),
        labels=labels,
        annotations=annotations,
    )


def _ignore_missing(call: Any, *args: Any, **kwargs: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        call(*args, **kwargs)
    except ApiException as err:
        if err.status != 404:
            raise


class K8sSandbox(Sandbox):
    name = "k8s"

    def _placement(self) -> tuple[K8sPlacement, Path]:
        placement = self.runtime.k8s
        if not self.runtime.in_image:
            raise SandboxUnavailable(
                "environment.sandbox k8s runs hangar's runtime from the pod's image: set "
                "HANGAR_SANDBOX_RUNTIME=image (the project image does) and run hangar in it"
            )
        if not placement.shared_claim or placement.shared_path is None:
            raise SandboxUnavailable(
                "environment.sandbox k8s needs the shared ReadWriteMany claim: set "
                "HANGAR_K8S_SHARED_CLAIM (its name) and HANGAR_K8S_SHARED_PATH (where this pod "
                "mounts it; HANGAR_HOME and TMPDIR under it), deploy/k8s"
            )
        return placement, placement.shared_path.resolve()

    def run(self, request: SandboxRequest) -> SandboxResult:
        check_request(request, needs_root=False)
        placement, root = self._placement()
        image = request.image or self.image or self.runtime.image
        if not image:
            raise SandboxUnavailable(
                "environment.sandbox k8s needs an image: pin environment.image to the project "
                "image by digest (repo@sha256:...), or set HANGAR_SANDBOX_IMAGE"
            )
        ns = namespace(placement)
        binds, bridged = socket_dirs(request.mounts)
        uid, gid = command_user(request)
        name = f"hangar-sbx-{secrets.token_hex(6)}"
        labels, annotations = sandbox_labels(name, {**self.labels, **request.labels})
        annotations[OWNER_ANNOTATION] = owner(placement)
        # Under TMPDIR, which lies on the claim.
        control = Path(tempfile.mkdtemp(prefix="hangar-k8s-"))
        owners: list[tuple[Path, int, int]] = []
        bridges: list[_Bridge] = []
        try:
            owners = hand_to_command(request, uid, binds)
            plan = pod_plan(
                request, name=name, namespace=ns, image=image, claim=placement.shared_claim,
                root=root, control=control, uid=uid, gid=gid, binds=binds,
                scratch=[m.target for m, _ in bridged], labels=labels, annotations=annotations,
            )  # fmt: skip
            peer = None
            wiring: list[tuple[str, str, int]] = []
            if bridged:
                own = _own_pod(_own_name(placement), ns)
                for m, sockets in bridged:
                    for sock in sockets:
                        bridges.append(_Bridge(m.source / sock))
                        wiring.append((f"{m.target}/{sock}", own.ip, bridges[-1].port))
                try:
                    selector = peer_labels(own.labels)
                except ValueError as err:
                    raise SandboxUnavailable(f"{err}: give its pod a label") from None
                peer = Peer(own.namespace, selector, tuple(b.port for b in bridges))
            write_setup(request, uid, gid, control, bridges=wiring)
            if os.geteuid() == 0 and uid != os.geteuid():
                hand_over([control], uid)  # the wrapper runs as the command's uid
            policy = network_policy(name, ns, {MANAGED_LABEL: "1", SANDBOX_LABEL: name}, peer)
            return self._run(request, pod_manifest(plan), policy, control, bridges)
        finally:
            for b in bridges:
                b.close()
            hand_back(owners, uid)
            shutil.rmtree(control, ignore_errors=True)

    def _run(
        self,
        request: SandboxRequest,
        pod: dict[str, Any],
        policy: dict[str, Any],
        control: Path,
        bridges: list[_Bridge],
    ) -> SandboxResult:
        core, net = _core(), _net()
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        started = time.monotonic()
        out, err, followers = tails(control, request)
        created = False
        stopped = False
        code: int | None = None
        try:
            try:
                # The policy first: the pod never runs without it.
                net.create_namespaced_network_policy(ns, policy)
                core.create_namespaced_pod(ns, pod)
                created = True
            except Exception as exc:  # noqa: BLE001  any refusal: no sandbox
                raise _api_error(f"creating sandbox pod {ns}/{name}", exc) from None
            for t in followers:
                t.start()
            code, stopped = self._wait(core, name, ns, request, started, bridges)
        finally:
            try:
                if created:
                    _ignore_missing(core.delete_namespaced_pod, name, ns, grace_period_seconds=0)
                _ignore_missing(net.delete_namespaced_network_policy, name, ns)
            finally:
                stop_tails(followers, reopen=True)
        cancelled = stopped and request.cancel is not None and request.cancel.is_set()
        return SandboxResult(
            exit_code=None if stopped else code,
            timed_out=stopped and not cancelled,
            cancelled=cancelled,
            stdout=bytes(out.data).decode("utf-8", errors="replace"),
            stderr=bytes(err.data).decode("utf-8", errors="replace"),
            duration_s=time.monotonic() - started,
        )

    def _wait(
        self,
        core: Any,
        name: str,
        ns: str,
        request: SandboxRequest,
        started: float,
        bridges: list[_Bridge],
    ) -> tuple[int | None, bool]:
        """Poll the pod until it ends (its exit code, False) or is stopped (None, True)."""
        running_since: float | None = None
        pause = _POLL_MIN_S
        while True:
            try:
                pod = core.read_namespaced_pod(name, ns)
            except Exception as exc:  # noqa: BLE001
                raise _api_error(f"reading sandbox pod {ns}/{name}", exc) from None
            status = pod.status
            phase = status.phase if status else None
            state = None
            if status and status.container_statuses:
                state = status.container_statuses[0].state
            waiting = state.waiting if state else None
            if waiting is not None and waiting.reason in _CANNOT_START:
                raise SandboxUnavailable(
                    f"sandbox pod {ns}/{name} cannot start: {waiting.reason}: "
                    f"{waiting.message or ''}".rstrip(": ")
                )
            now = time.monotonic()
            if phase in ("Running", "Succeeded", "Failed") and running_since is None:
                running_since = now
            if status is not None and status.pod_ip:
                for b in bridges:
                    b.allowed = str(status.pod_ip)
            if phase in ("Succeeded", "Failed"):
                terminated = state.terminated if state else None
                if terminated is not None:
                    return int(terminated.exit_code), False
                if status.reason == "DeadlineExceeded":
                    return None, True
                raise SandboxUnavailable(
                    f"sandbox pod {ns}/{name} ended {phase} with no exit code: "
                    f"{status.reason}: {status.message}"
                )
            if running_since is None and now - started > START_TIMEOUT_S:
                why = f"{waiting.reason}: {waiting.message}" if waiting else f"phase {phase}"
                raise SandboxUnavailable(
                    f"sandbox pod {ns}/{name} did not start within {START_TIMEOUT_S:.0f} s ({why})"
                )
            over = running_since is not None and now >= running_since + request.timeout_s
            if over or (request.cancel is not None and request.cancel.is_set()):
                return None, True
            if request.cancel is not None:
                request.cancel.wait(pause)
            else:
                time.sleep(pause)
            pause = min(pause * 1.5, _POLL_MAX_S)

    def describe(self) -> dict[str, str]:
        info = {
            "backend": self.name,
            "version": f"kubernetes {server_version()}",
            # Namespaces and cgroups, as the other backends: what environment.isolation names.
            "isolation": "namespaces",
        }
        if self.image is not None:
            info["image"] = self.image  # what the pods run: the pinned digest itself
        return info


def cleanup_leftovers(placement: K8sPlacement) -> int:
    """Delete sandbox pods (and their policies) whose owner is gone; how many pods.

    An owner in a pod is gone when that pod is (or has ended); an owner on a host outside the
    cluster is checked only from that host (its process); pods of other hosts are left.
    """
    try:
        return _cleanup(placement)
    except SandboxUnavailable:
        raise
    except Exception as err:  # noqa: BLE001  the API refused or is gone: say so, remove nothing
        raise _api_error("looking for leftover sandbox pods", err) from None


def _cleanup(placement: K8sPlacement) -> int:
    core, net = _core(), _net()
    ns = namespace(placement)
    me = _own_name(placement)
    selector = f"{MANAGED_LABEL}=1"
    removed = 0
    pods = core.list_namespaced_pod(ns, label_selector=selector).items
    alive_pods: set[str] = set()
    for pod in pods:
        who = (pod.metadata.annotations or {}).get(OWNER_ANNOTATION, "")
        if _owner_alive(core, ns, who, me):
            alive_pods.add(pod.metadata.name)
            continue
        _ignore_missing(core.delete_namespaced_pod, pod.metadata.name, ns, grace_period_seconds=0)
        _ignore_missing(net.delete_namespaced_network_policy, pod.metadata.name, ns)
        removed += 1
    for policy in net.list_namespaced_network_policy(ns, label_selector=selector).items:
        if policy.metadata.name not in alive_pods:
            _ignore_missing(net.delete_namespaced_network_policy, policy.metadata.name, ns)
    return removed


def _owner_alive(core: Any, ns: str, who: str, me: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    kind, _, rest = who.partition("/")
    parts = rest.split(":")
    if kind not in ("pod", "host") or len(parts) != 3 or not parts[1].isdigit():
        return True  # not ours to judge
    where, pid, start = parts
    if where == me:
        return _process_start(int(pid)) == start
    if kind == "host":
        return True  # another machine's process: only it can tell
    try:
        pod = core.read_namespaced_pod(where, ns)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return (pod.status.phase if pod.status else None) in ("Pending", "Running")
