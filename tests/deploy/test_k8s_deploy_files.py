"""deploy/k8s validated as far as this machine allows (no cluster, no Helm, no chart repository):

- the Helm values against the official Dagster chart's own values schema, copied with its source
  and commits in ../shared/k8s/dagster-chart/ (SOURCE.md), merged onto the chart's defaults as
  Helm merges them; the schema's remote references to Kubernetes definitions (yannh v1.19.0)
  resolved offline to kubernetes-validate's definitions of ``K8S_VERSION``;
- the run launcher config the chart renders from them, and the code location's container
  context, against dagster-k8s's own config schema; then the run worker Job dagster-k8s itself
  builds from both (its ``K8sRunLauncher``, the Kubernetes API stubbed at the batch client),
  against the Kubernetes schema;
- every object in deploy/k8s/*.yaml against the Kubernetes schema (``K8S_VERSION``, strict).

The chart's templates are not rendered (no ``helm`` here): the launcher config and container
context are rebuilt from the values as the chart's ``_run-launcher.tpl`` and the user
deployments' ``_helpers.tpl`` (``dagsterUserDeployments.k8sContainerContext``) write them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from tests.k8sfake import K8S_VERSION, FakeCluster, validate

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
CHART = REPO.parent / "shared" / "k8s" / "dagster-chart"
SUBCHART = CHART / "charts" / "dagster-user-deployments"
REMOTE = "https://raw.githubusercontent.com/yannh/kubernetes-json-schema/master/v1.19.0/_definitions.json"
RELEASE, NAMESPACE = "hangar", "hangar"
IMAGE = "registry.example.com/hangar-dagster@sha256:" + "b" * 64

needs_chart = pytest.mark.skipif(
    not (CHART / "values.schema.json").is_file(),
    reason=f"the chart's values schema is not at {CHART} (../shared/k8s/dagster-chart)",
)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def helm_merge(base: Any, over: Any) -> Any:
    """Helm's coalescing of values: maps merge key by key, anything else (lists) is replaced,
    and a null removes the key."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = helm_merge(out.get(key), value)
    return out


def chart_validator(schema_path: Path) -> jsonschema.Draft202012Validator:
    """The chart's schema with its remote Kubernetes references served offline."""
    defs_dir = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    defs = json.loads((defs_dir / f"v{K8S_VERSION}-local" / "_definitions.json").read_text())
    # The chart names them "#/definitions/<name>"; these files keep them under "$defs".
    served = {"$schema": defs["$schema"], "$defs": defs["$defs"], "definitions": defs["$defs"]}
    registry: Registry = Registry().with_resource(REMOTE, Resource.from_contents(served))
    schema = json.loads(schema_path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def errors(validator: jsonschema.Draft202012Validator, values: Any) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)
    ]


def chart_values(*files: str) -> dict[str, Any]:
    values = load(CHART / "values.yaml")
    for name in files:
        values = helm_merge(values, load(K8S / name))
    return dict(values)


def subchart_values(parent: Mapping[str, Any]) -> dict[str, Any]:
    """What the subchart is given: its defaults, the parent's section for it, the globals."""
    values = helm_merge(load(SUBCHART / "values.yaml"), parent["dagster-user-deployments"])
    values["global"] = helm_merge(values.get("global") or {}, parent["global"])
    return dict(values)


VALUES_FILES = [("values.yaml",), ("values.yaml", "values-chart-postgres.yaml")]


@needs_chart
@pytest.mark.parametrize("files", VALUES_FILES, ids=lambda f: "+".join(f))
def test_the_values_validate_against_the_charts_own_schema(files: tuple[str, ...]) -> None:
    values = chart_values(*files)
    assert errors(chart_validator(CHART / "values.schema.json"), values) == []
    sub = subchart_values(values)
    assert errors(chart_validator(SUBCHART / "values.schema.json"), sub) == []
    (deployment,) = sub["deployments"]
    assert deployment["name"] == "hangar"
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is (files[-1] == "values-chart-postgres.yaml")


@needs_chart
def test_the_chart_schema_check_can_fail() -> None:
    values = chart_values("values.yaml")
    values["runLauncher"]["config"]["k8sRunLauncher"]["imagePulPolicy"] = "Always"  # a typo
    # And a Kubernetes object inside the values, checked through the resolved references.
    env = values["dagster-user-deployments"]["deployments"][0]["env"]
    env.append({"name": "X", "valueFrom": {"fieldRef": {}}})  # fieldPath is required
    found = errors(chart_validator(CHART / "values.schema.json"), values)
    assert any("imagePulPolicy" in e for e in found), found
    assert any("fieldPath" in e for e in found), found


def launcher_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """K8sRunLauncher's config as the chart's _run-launcher.tpl renders it from ``values``."""
    k = values["runLauncher"]["config"]["k8sRunLauncher"]
    g = values["global"]
    config: dict[str, Any] = {
        "load_incluster_config": k["loadInclusterConfig"],
        "job_namespace": k.get("jobNamespace") or NAMESPACE,
        "image_pull_policy": k["imagePullPolicy"],
        "service_account_name": g["serviceAccountName"],
        "dagster_home": g["dagsterHome"],
        "instance_config_map": f"{RELEASE}-dagster-instance",
        "postgres_password_secret": g["postgresqlSecretName"],
    }
    if k.get("envConfigMaps"):
        config["env_config_maps"] = [c["name"] for c in k["envConfigMaps"]]
    for key, out in (("envSecrets", "env_secrets"),):
        if k.get(key):
            config[out] = [s["name"] for s in k[key]]
    for key, out in (
        ("envVars", "env_vars"),
        ("volumeMounts", "volume_mounts"),
        ("volumes", "volumes"),
        ("labels", "labels"),
        ("resources", "resources"),
        ("securityContext", "security_context"),
    ):
        if k.get(key):
            config[out] = k[key]
    if k.get("failPodOnRunFailure"):
        config["fail_pod_on_run_failure"] = True
    return config


def container_context(values: Mapping[str, Any], deployment: Mapping[str, Any]) -> dict[str, Any]:
    """The code location's container context, as the user deployments' _helpers.tpl writes it
    into DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT (includeConfigInLaunchedRuns)."""
    k8s: dict[str, Any] = {
        "image_pull_policy": deployment["image"]["pullPolicy"],
        "env_config_maps": [
            f"{RELEASE}-dagster-user-deployments-{deployment['name']}-user-env",
            *(c["name"] for c in deployment.get("envConfigMaps") or []),
        ],
        "namespace": NAMESPACE,
        "service_account_name": values["global"]["serviceAccountName"],
        "run_k8s_config": {"pod_spec_config": {"automount_service_account_token": True}},
    }
    if deployment.get("envSecrets"):
        k8s["env_secrets"] = [s["name"] for s in deployment["envSecrets"]]
    for key, out in (
        ("volumeMounts", "volume_mounts"),
        ("volumes", "volumes"),
        ("labels", "labels"),
        ("resources", "resources"),
        ("env", "env"),
    ):
        if deployment.get(key):
            k8s[out] = deployment[key]
    return {"k8s": k8s}


class _Captured:
    """The batch API K8sRunLauncher creates its Job through: keeps the Job instead."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def create_namespaced_job(self, body: Any, namespace: str, **_: Any) -> None:
        self.jobs.append((body, namespace))


class _Instance:
    def add_run_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        pass

    def report_engine_event(self, *args: Any, **kwargs: Any) -> None:
        pass


@needs_chart
def test_the_run_launcher_and_the_run_worker_job_it_builds_validate(tmp_path: Path) -> None:
    from dagster._config import process_config
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster_k8s import K8sRunLauncher
    from dagster_k8s.container_context import K8sContainerContext
    from kubernetes.client import ApiClient

    values = chart_values("values.yaml")
    processed = process_config(K8sRunLauncher.config_type(), launcher_config(values))
    assert processed.success, processed.errors
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    context = container_context(values, deployment)
    K8sContainerContext.create_from_config(context)  # dagster-k8s's own schema: raises if bad

    # The Job dagster-k8s builds for a stage run of this code location, through its own code.
    captured = _Captured()
    kubeconfig = FakeCluster().kubeconfig(tmp_path / "kubeconfig", url="http://127.0.0.1:9")
    launcher = K8sRunLauncher(
        **{**processed.value, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)},
        k8s_client_batch_api=captured,
    )
    instance = _Instance()  # held: the launcher keeps only a weak reference
    launcher.register_instance(instance)  # type: ignore[arg-type]
    origin = JobPythonOrigin(
        "trials_stage",
        RepositoryPythonOrigin(
            executable_path="/opt/hangar/bin/python",
            code_pointer=ModuleCodePointer(
                "hangar_dagster.orchestration.definitions", "defs", None
            ),
            container_image=IMAGE,
            container_context=context,
        ),
    )
    run = DagsterRun(job_name="trials_stage", run_id="3f2a9c1e", job_code_origin=origin)
    launcher._launch_k8s_job_with_args("dagster-run-3f2a9c1e", ["dagster", "api"], run)
    ((job, namespace),) = captured.jobs
    manifest = ApiClient().sanitize_for_serialization(job)
    validate(manifest)
    assert namespace == NAMESPACE
    pod = manifest["spec"]["template"]
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["dagster/run-id"] == "3f2a9c1e"  # what a policy selects
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "run_worker"
    assert spec["serviceAccountName"] == "hangar-dagster"  # bound by deploy/k8s/hangar.yaml
    (container,) = spec["containers"]
    assert container["image"] == IMAGE
    assert {"name": "hangar-shared", "mountPath": "/srv/hangar"} in container["volumeMounts"]
    assert {
        "name": "hangar-shared",
        "persistentVolumeClaim": {"claimName": "hangar-shared"},
    } in spec["volumes"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HANGAR_K8S_SHARED_CLAIM"]["value"] == "hangar-shared"
    assert env["HANGAR_K8S_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TMPDIR"]["value"].startswith(env["HANGAR_K8S_SHARED_PATH"]["value"])
    assert env["HANGAR_HOME"]["value"].startswith(env["HANGAR_K8S_SHARED_PATH"]["value"])
    assert {"secretRef": {"name": "hangar-secrets"}} in container["envFrom"]


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


@pytest.mark.parametrize("name,doc", manifests(), ids=[n for n, _ in manifests()])
def test_every_manifest_in_deploy_k8s_validates(name: str, doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_manifests_are_the_ones_the_sandbox_backend_needs() -> None:
    by_kind = {d["kind"]: d for _, d in manifests()}
    assert set(by_kind) >= {"PersistentVolumeClaim", "Role", "RoleBinding", "NetworkPolicy"}
    assert by_kind["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    rules = {r["resources"][0]: set(r["verbs"]) for r in by_kind["Role"]["rules"]}
    assert rules == {"pods": {"create", "get", "list", "delete"},
                     "networkpolicies": {"create", "get", "list", "delete"}}  # fmt: skip
    values = load(K8S / "values.yaml")
    assert by_kind["RoleBinding"]["subjects"][0]["name"] == values["global"]["serviceAccountName"]
    deny = next(d for n, d in manifests() if "default-deny" in n)
    assert deny["spec"]["podSelector"] == {"matchLabels": {"hangar.managed": "1"}}
    assert deny["spec"]["egress"] == [] and deny["spec"]["ingress"] == []
