"""The Kubernetes sandbox's pods, run under Docker: the same trial outcome as the Docker backend.

No cluster is reachable here, so a STAND-IN plays it (tests/k8sfake.py): an API server at the
HTTP level that hangar's real ``kubernetes`` client talks to, and ``DockerKubelet`` below, which
runs each created pod's container spec under Docker as it is written: the same image, command,
args, env, working directory, user and group, read-only root filesystem, capabilities dropped,
no privilege escalation, memory/CPU limits, the claim's ``subPath`` mounts (bound from the
shared directory that stands in for the ReadWriteMany volume, read-only where the pod says)
and ``emptyDir`` volumes (tmpfs), and no network (every pod here has a deny-all
NetworkPolicy: nothing is bridged). A pod field it does not translate fails the pod, so nothing
of the spec is silently dropped.

hangar itself runs in a run worker container of the project image (as K8sRunLauncher would start
it, with the shared directory at the same path, ``HANGAR_SANDBOX_RUNTIME=image``): first with
``environment.sandbox: docker`` (the Engine socket), then with ``k8s`` (the stand-in API
server, on the host's loopback), the same two trials of the example and their grades. What this
does not run: a real API server (admission, Pod Security), a kubelet (its volume handling,
``activeDeadlineSeconds``), a scheduler, a CNI enforcing NetworkPolicy, a network volume.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.trials.sandbox.docker import MANAGED_LABEL, OWNER_LABEL, _owner, client
from tests.conftest import one_task_spec
from tests.deploy.conftest import run_in_worker
from tests.k8sfake import FakeCluster, Kubelet, terminated

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs_sandbox("docker"),
    pytest.mark.needs_sandbox("root"),
]

CLAIM = "hangar-shared"
# Runs in the run worker: the example's trials and grades, on the backend of the spec given.
SNIPPET = r"""
import json, sys
from pathlib import Path
from hangar_dagster.experiment.submit import submit
from hangar_dagster.grading.grader import grade_trial
from hangar_dagster.settings import Settings
from hangar_dagster.trials.trial import TrialRequest, run_trial

settings = Settings.from_env()
out = {}
for spec in sys.argv[1:]:
    exp = submit(Path(spec), settings)
    for key in exp.trial_keys():
        req = TrialRequest(experiment=exp, key=key, attempt=1, retry_of=None, run_id="k8s-test")
        record, patch = run_trial(req, settings)
        grade = grade_trial(exp, record, patch, None, "k8s-test", settings.paths, settings)
        out[f"{exp.spec.environment.sandbox}:{key.key}"] = {
            "outcome": record.outcome_class, "infra": record.infra_reason, "error": record.error,
            "verify": (record.trace.get("verify") or {}).get("exit_code"), "patch": patch,
            "backend": record.manifest["sandbox"]["backend"], "passed": grade.passed,
            "tests": grade.hidden_tests, "reason": grade.reason, "trust": grade.trust,
        }
print(json.dumps(out))
"""


def _memory(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


class DockerKubelet(Kubelet):
    """Runs a pod's one container under Docker, as the pod spec says (see the module doc)."""

    POD_FIELDS = {
        "restartPolicy", "activeDeadlineSeconds", "terminationGracePeriodSeconds",
        "automountServiceAccountToken", "enableServiceLinks", "hostNetwork", "hostPID",
        "hostIPC", "securityContext", "containers", "volumes",
    }  # fmt: skip
    CONTAINER_FIELDS = {
        "name", "image", "imagePullPolicy", "command", "args", "workingDir", "env",
        "securityContext", "resources", "volumeMounts",
    }  # fmt: skip

    def __init__(self, shared: Path, label: str) -> None:
        self.shared, self.label = shared, label
        self.containers: dict[str, str] = {}
        self.errors: list[str] = []
        self.pods: list[dict[str, Any]] = []

    def container_args(self, pod: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
        from docker.types import Mount

        spec = pod["spec"]
        (c,) = spec["containers"]
        extra = (set(spec) - self.POD_FIELDS) | (set(c) - self.CONTAINER_FIELDS)
        if extra:
            raise ValueError(f"fields this kubelet does not translate: {sorted(extra)}")
        assert spec["restartPolicy"] == "Never" and not spec["automountServiceAccountToken"]
        assert not (spec["hostNetwork"] or spec["hostPID"] or spec["hostIPC"])
        psc, sc = spec["securityContext"], c["securityContext"]
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        gid = sc.get("runAsGroup", psc.get("runAsGroup"))
        if (psc.get("runAsNonRoot") or sc.get("runAsNonRoot")) and not uid:
            raise ValueError("runAsNonRoot with no non-root runAsUser")
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["privileged"] is False
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}  # Docker's default profile
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts, tmpfs = [], {}
        for m in c["volumeMounts"]:
            v = volumes[m["name"]]
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] == CLAIM
                source = str(self.shared / m.get("subPath", ""))
                mounts.append(
                    Mount(m["mountPath"], source, type="bind", read_only=m.get("readOnly", False))
                )
            elif "emptyDir" in v:
                size = v["emptyDir"].get("sizeLimit")
                tmpfs[m["mountPath"]] = "rw,exec,nosuid,nodev" + (
                    f",size={_memory(size)}" if size else ""
                )
            else:
                raise ValueError(f"volume kind of {v['name']} not translated")
        # Deny-all egress and no bridged port: the pod reaches nothing.
        if policy["spec"]["egress"] != [] or "Egress" not in policy["spec"]["policyTypes"]:
            raise ValueError("this kubelet runs only pods whose policy allows no egress")
        limits = c["resources"]["limits"]
        host_config = client().api.create_host_config(
            mounts=mounts,
            tmpfs=tmpfs,
            read_only=sc["readOnlyRootFilesystem"],
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=[] if sc["allowPrivilegeEscalation"] else ["no-new-privileges"],
            mem_limit=_memory(limits["memory"]),
            memswap_limit=_memory(limits["memory"]),
            nano_cpus=int(float(limits["cpu"].rstrip("m")) * 1e6) if "cpu" in limits else None,
        )
        return {
            "image": c["image"],
            "entrypoint": c["command"],
            "command": c["args"],
            "environment": {e["name"]: e["value"] for e in c.get("env") or []},
            "working_dir": c["workingDir"],
            "user": f"{uid}:{gid}",
            "host_config": host_config,
            "labels": {self.label: "1", MANAGED_LABEL: "1", OWNER_LABEL: _owner()},
        }

    def start(self, cluster: FakeCluster, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        api = client().api
        try:
            args = self.container_args(pod, cluster.policies[name])
            cid = api.create_container(**args)["Id"]
            self.containers[name] = cid
            self.pods.append(pod)
            api.start(cid)
            cluster.set_state(name, "Running", {"running": {}})
            deadline = pod["spec"]["activeDeadlineSeconds"]
            try:
                code = api.wait(cid, timeout=deadline)["StatusCode"]
            except Exception:  # noqa: BLE001  past the deadline: the kubelet kills it
                api.kill(cid)
                cluster.set_state(name, "Failed", {"terminated": {"exitCode": 137}})
                return
            phase = "Succeeded" if code == 0 else "Failed"
            cluster.set_state(name, phase, terminated(int(code)))
        except Exception as err:  # noqa: BLE001  the test fails on any: see errors
            self.errors.append(f"{name}: {type(err).__name__}: {err}")
            cluster.set_state(name, "Failed", {"waiting": {"reason": "CreateContainerError"}})

    def stop(self, pod: dict[str, Any]) -> None:
        cid = self.containers.pop(pod["metadata"]["name"], None)
        if cid is not None:
            try:
                client().api.remove_container(cid, force=True)
            except Exception:  # noqa: BLE001  gone already
                pass


def test_a_trial_pod_under_docker_ends_as_the_docker_backends_trial(
    project_image: str, example_dir: Path, tmp_path: Path
) -> None:
    import shutil

    shared = tmp_path / "shared"
    (shared / "tmp").mkdir(parents=True)
    example = shared / "example"
    shutil.copytree(example_dir, example)
    specs = [
        one_task_spec(example, f"{sandbox}.yaml", sandbox=sandbox, image=project_image)
        for sandbox in ("docker", "k8s")
    ]
    label = f"hangar.test.k8s-kubelet-{uuid.uuid4().hex[:8]}"
    kubelet = DockerKubelet(shared, label)
    cluster = FakeCluster(kubelet)
    cluster.start()
    env = {
        "HANGAR_HOME": str(shared / "home"),
        "TMPDIR": str(shared / "tmp"),
        "HANGAR_K8S_SHARED_CLAIM": CLAIM,
        "HANGAR_K8S_SHARED_PATH": str(shared),
        "HANGAR_K8S_NAMESPACE": cluster.namespace,
        "KUBECONFIG": str(cluster.kubeconfig(shared / "kubeconfig")),
    }
    try:
        status, logs = run_in_worker(
            project_image,
            shared,
            ["python", "-c", SNIPPET, *map(str, specs)],
            env,
            timeout=900,
            network_mode="host",  # the stand-in API server listens on the host's loopback
            labels={label: "1"},
        )
    finally:
        cluster.stop()
        for c in client().api.containers(all=True, filters={"label": label}):
            client().api.remove_container(c["Id"], force=True)
    assert status == 0, logs[-5000:]
    assert kubelet.errors == []
    results = json.loads(logs.strip().splitlines()[-1])
    keys = sorted(k.split(":", 1)[1] for k in results if k.startswith("docker:"))
    assert keys == ["plain/median/1", "skill/median/1"]
    for key in keys:
        on_docker, on_k8s = results[f"docker:{key}"], results[f"k8s:{key}"]
        assert (on_docker["backend"], on_k8s["backend"]) == ("docker", "k8s")
        assert on_docker["infra"] is None and on_k8s["infra"] is None, (on_docker, on_k8s)
        same = ("outcome", "verify", "patch", "passed", "tests", "reason", "trust")
        assert {k: on_k8s[k] for k in same} == {k: on_docker[k] for k in same}, key
    # The example's point survives the move: the skill's patch passes, sealed, uid split.
    assert results["k8s:skill/median/1"]["passed"] is True
    assert {r["trust"] for r in results.values()} == {"isolated"}
    # Every sandbox was a pod: the agent, verify and the grade of each trial, all deleted.
    assert len(kubelet.pods) >= 6 and cluster.pods == {} and cluster.policies == {}
    mounts = [m for p in kubelet.pods for m in p["spec"]["containers"][0]["volumeMounts"]]
    hidden = [m for m in mounts if "/hidden" in m.get("subPath", "")]
    assert hidden and all(m["readOnly"] for m in hidden)  # the grades' hidden tests
    users = {p["spec"]["securityContext"]["runAsUser"] for p in kubelet.pods}
    assert 0 not in users and len(users) >= 3  # the agent's uid and one fresh uid per grade
    assert client().api.containers(all=True, filters={"label": label}) == []
