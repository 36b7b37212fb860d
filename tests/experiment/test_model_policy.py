"""Model policy: aliases refused at submit and at start, policies resolved once with their basis."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import dagster as dg
import pytest
import yaml

from hangar_dagster.experiment.harness import freeze
from hangar_dagster.experiment.model_policy import (
    ModelCatalog,
    ModelListError,
    cache_dir,
    floating_reason,
    provider_of,
)
from hangar_dagster.experiment.plan import TrialKey
from hangar_dagster.experiment.spec import SpecError, load_spec
from hangar_dagster.experiment.submit import resolve, submit
from hangar_dagster.orchestration.assets import build_experiment_assets
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings, paths
from hangar_dagster.trials.trial import TrialRequest, run_trial
from tests.conftest import command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.unit

SHIPPED_SONNET = "claude-sonnet-4-5-20250929"


@pytest.mark.parametrize(
    "alias",
    [
        "opus",
        "Sonnet",
        "haiku",
        "claude-opus-latest",
        "claude-3-5-sonnet-latest",
        "gpt-5",
        "~anthropic/claude-sonnet-latest",
        "my-model",
    ],
)
def test_floating_aliases_are_named(alias: str) -> None:
    assert floating_reason(alias, frozenset()) is not None


def test_an_alias_the_environment_declares_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert floating_reason("team-model-2025-01-01", Settings.from_env().model_aliases) is None
    monkeypatch.setenv("HANGAR_MODEL_ALIASES", "fast, Team-Model-2025-01-01")
    declared = Settings.from_env().model_aliases
    assert declared == {"fast", "team-model-2025-01-01"}
    assert "HANGAR_MODEL_ALIASES" in str(floating_reason("team-model-2025-01-01", declared))


def test_providers_are_read_from_ids_and_aliases() -> None:
    assert provider_of("claude-opus-4-1-20250805") == "anthropic"
    assert provider_of("~anthropic/claude-sonnet-latest") == "anthropic"
    assert provider_of("openrouter/openai/gpt-5-2025-08-07") == "openai"
    assert provider_of("gpt-5") == "openai" and provider_of("fixer-2025-01-01") is None


def write_cache(home: Path, provider: str, ids: list[str]) -> None:
    """``ids`` as ``provider``'s refreshed list under the hangar home ``home``."""
    target = cache_dir(HangarPaths(home))
    target.mkdir(parents=True, exist_ok=True)
    body = {"provider": provider, "fetched_at": "2026-01-02T00:00:00+00:00", "models": ids}
    (target / f"{provider}.json").write_text(json.dumps(body))


def test_policies_resolve_from_the_cached_list_with_basis_list(tmp_path: Path) -> None:
    ids = ["claude-sonnet-4-20250514", "claude-sonnet-9-20270101", "claude-opus-9-20270202"]
    write_cache(tmp_path, "anthropic", ids)
    catalog = ModelCatalog(tmp_path / "cache" / "models", frozenset())
    balanced = catalog.choose("balanced", "claude-code")
    assert (balanced.model, balanced.basis, balanced.note) == (
        "claude-sonnet-9-20270101",
        "list",
        None,
    )
    frontier = catalog.choose("anthropic:frontier", "command")
    assert (frontier.model, frontier.basis) == ("claude-opus-9-20270202", "list")
    listed = catalog.choose("claude-sonnet-4-20250514", "claude-code")
    assert listed.basis == "list" and listed.concrete


def test_a_bare_policy_takes_the_adapters_provider(tmp_path: Path) -> None:
    write_cache(tmp_path, "anthropic", ["claude-sonnet-9-20270101", "claude-opus-9-20270202"])
    write_cache(
        tmp_path, "openai", ["gpt-5.2-2027-01-01", "gpt-5.2-mini-2027-01-01", "o3-2025-04-16"]
    )
    catalog = ModelCatalog(tmp_path / "cache" / "models", frozenset())
    chosen = {
        (policy, adapter): catalog.choose(policy, adapter).model
        for policy in ("balanced", "frontier")
        for adapter in ("claude-code", "codex", "mini-swe-agent")
    }
    assert chosen == {
        ("balanced", "claude-code"): "claude-sonnet-9-20270101",
        ("frontier", "claude-code"): "claude-opus-9-20270202",
        # mini-swe-agent reaches models through the OpenAI API, as codex does.
        ("balanced", "codex"): "gpt-5.2-mini-2027-01-01",
        ("frontier", "codex"): "gpt-5.2-2027-01-01",
        ("balanced", "mini-swe-agent"): "gpt-5.2-mini-2027-01-01",
        ("frontier", "mini-swe-agent"): "gpt-5.2-2027-01-01",
    }


def test_an_id_the_list_lacks_is_decided_by_its_dated_shape(tmp_path: Path) -> None:
    write_cache(tmp_path, "anthropic", ["claude-sonnet-9-20270101"])  # no opus at all
    catalog = ModelCatalog(tmp_path / "cache" / "models", frozenset())
    unlisted = catalog.choose("claude-sonnet-4-5-20250929", "claude-code")
    assert unlisted.basis == "pattern" and "dated shape" in str(unlisted.note)
    # The cached list has no opus: the shipped snapshot names one, vouched for by its date only.
    frontier = catalog.choose("frontier", "claude-code")
    assert frontier.model.startswith("claude-opus-") and frontier.basis == "pattern"
    assert "anthropic.json" in str(frontier.note) and "shipped" in str(frontier.note)
    unknown = ModelCatalog(None, frozenset()).choose("fixer-2025-01-01", "command")
    assert unknown.basis == "pattern" and "no provider model list" in str(unknown.note)
    # The note reads as a sentence (it once said "is not in no provider model list").
    assert "not in no" not in str(unknown.note)
    assert str(unknown.note).startswith("model fixer-2025-01-01 is in no provider model list")


def test_without_a_cache_the_shipped_list_answers_and_bad_input_is_named(tmp_path: Path) -> None:
    catalog = ModelCatalog(tmp_path / "empty", frozenset())
    assert catalog.choose("balanced", "claude-code").model == SHIPPED_SONNET
    assert catalog.choose("balanced", "standin").model == "standin-scripted-2026-01-01"
    with pytest.raises(ModelListError, match="anthropic:balanced or openai:balanced"):
        catalog.choose("balanced", "command")
    alias = catalog.choose("opus", "claude-code")  # ordinary jobs keep it, not concrete
    assert not alias.concrete and alias.model == "opus"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "openai.json").write_text("{not json")
    with pytest.raises(ModelListError, match=r"openai\.json.*hangar models refresh openai"):
        catalog.choose("gpt-5-2025-08-07", "codex")


def test_a_refusal_names_the_alias_and_what_the_policies_resolve_to_now(tmp_path: Path) -> None:
    write_cache(tmp_path, "anthropic", ["claude-sonnet-9-20270101", "claude-opus-9-20270202"])
    refused = ModelCatalog(tmp_path / "cache" / "models", frozenset()).refusal(
        "opus", "claude-code"
    )
    assert refused is not None
    assert "'opus'" in refused.message
    assert "anthropic balanced -> claude-sonnet-9-20270101" in refused.message
    assert "anthropic frontier -> claude-opus-9-20270202" in refused.message
    assert ModelCatalog(None, frozenset()).refusal("balanced", "claude-code") is None


# --- submit, start, trials -----------------------------------------------------------------


def model_spec(example_dir: Path, tmp_path: Path, name: str, model: str, command: str) -> Path:
    """The one-task command-harness spec, its lock running ``model``."""
    spec = command_agent_spec(example_dir, tmp_path, name, command)
    src = tmp_path / "model-src"
    src.mkdir()
    manifest = {
        "name": name,
        "agent": {"adapter": "command", "cli": "sh", "version": "1", "command": command},
        "model": model,
    }
    (src / "harness.yaml").write_text(yaml.safe_dump(manifest))
    spec["variants"] = {"v": {"harness_lock": freeze(src, tmp_path / "registry").ref}}
    return write_spec(example_dir, spec)


def test_submit_refuses_an_alias_naming_the_policies(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = model_spec(example_dir, tmp_path, "alias-submit", "sonnet", "true")
    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())
    [problem] = info.value.problems
    assert problem.path == "variants.v.harness_lock"
    assert (
        "'sonnet'" in problem.message
        and f"anthropic balanced -> {SHIPPED_SONNET}" in problem.message
    )
    assert "policy" in problem.fix
    # An ordinary job (hangar grade resolves the same spec) keeps the alias, not concrete.
    ordinary = resolve(load_spec(spec), spec, Settings.from_env())
    assert ordinary.variants["v"].model == "sonnet"
    assert ordinary.variants["v"].model_concrete_basis is None


@pytest.mark.integration
def test_hangar_grade_does_not_refuse_an_alias(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = model_spec(example_dir, tmp_path, "alias-grade", "opus", "true")
    result = hangar("grade", "--spec", str(spec), "--task", "median", "--base", home=hangar_home)
    assert result.returncode == 1, result.stderr  # graded (the base fails), not refused (2)
    assert "refused" not in result.stderr


@pytest.mark.needs_sandbox("bwrap")
def test_a_policy_resolves_once_and_every_trial_runs_and_records_that_id(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    command = (
        'echo "$HANGAR_MODEL" > MODEL.txt && '
        'stat -c %a "$HANGAR_HARNESS_DIR" "$HANGAR_HARNESS_DIR/harness.yaml" > MODES.txt'
    )
    spec = model_spec(example_dir, tmp_path, "policy-trial", "anthropic:balanced", command)
    # A provider list cached as `hangar models refresh` writes it: the basis is `list`.
    cache = cache_dir(paths())
    cache.mkdir(parents=True)
    listed = {"models": [SHIPPED_SONNET], "fetched_at": "2026-11-29T00:00:00+00:00"}
    (cache / "anthropic.json").write_text(json.dumps(listed))
    exp = submit(spec, Settings.from_env())
    variant = exp.variants["v"]
    assert (variant.model, variant.model_requested) == (SHIPPED_SONNET, "anthropic:balanced")
    assert variant.model_concrete_basis == "list" and variant.model_note is None

    record, patch = run_trial(
        TrialRequest(exp, TrialKey("v", "median", 1), 1, None, "r1"), Settings.from_env()
    )
    assert record.outcome_class == "completed", record.error
    assert (record.model, record.model_concrete, record.model_concrete_basis) == (
        SHIPPED_SONNET,
        True,
        "list",
    )
    assert f"+{SHIPPED_SONNET}" in patch  # the agent was handed the concrete id
    assert "+555\n+444" in patch  # it saw the thawed, read-only copy, not the registry's
    assert record.manifest["model_requested"] == "anthropic:balanced"


def test_without_a_fetched_list_the_shipped_snapshot_is_only_a_pattern_basis(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    # Regression: the snapshot shipped with hangar was taken as a provider list (basis list).
    spec = model_spec(example_dir, tmp_path, "no-cache", "anthropic:balanced", "true")
    exp = submit(spec, Settings.from_env())
    variant = exp.variants["v"]
    assert (variant.model, variant.model_concrete_basis) == (SHIPPED_SONNET, "pattern")
    assert variant.model_note is not None and "shipped" in variant.model_note


def test_a_pattern_basis_is_noted_on_the_experiment(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = model_spec(example_dir, tmp_path, "pattern-note", "fixer-model-2025-01-01", "true")
    exp = submit(spec, Settings.from_env())
    assert exp.variants["v"].model_concrete_basis == "pattern"
    notes = [n for n in Store(paths()).notes(exp.experiment_id) if n.kind == "model"]
    assert len(notes) == 1 and "fixer-model-2025-01-01" in notes[0].message
    assert "dated shape" in notes[0].message


@pytest.mark.integration
def test_an_alias_declared_after_submit_stops_the_experiment_at_start(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = "fixer-model-2025-01-01"
    spec = model_spec(example_dir, tmp_path, "alias-start", model, "true")
    exp = submit(spec, Settings.from_env())
    monkeypatch.setenv("HANGAR_MODEL_ALIASES", model)
    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())
    at_submit = str(info.value.problems[0])

    assets = build_experiment_assets(exp)
    result = dg.materialize(
        assets,
        selection=[dg.AssetKey([exp.experiment_id, "spec"])],
        resources={"hangar": HangarResource.from_settings(Settings.from_env())},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error is not None and at_submit in error.message
    [note] = [n for n in Store(paths()).notes(exp.experiment_id) if n.kind == "model"][-1:]
    assert at_submit in note.message and "may not start" in note.message


class _Models(BaseHTTPRequestHandler):
    """Anthropic's GET /v1/models, two pages; records the key it was sent."""

    pages = {
        None: {"data": [{"id": "claude-opus-9-20270202"}], "has_more": True, "last_id": "p1"},
        "p1": {"data": [{"id": "claude-sonnet-9-20270101"}], "has_more": False, "last_id": "p2"},
    }
    keys: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        after = parse_qs(url.query).get("after_id", [None])[0]
        self.keys.append(self.headers.get("x-api-key", ""))
        body = json.dumps(self.pages[after]).encode()
        self.send_response(200 if url.path == "/v1/models" else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def models_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_refresh_caches_the_provider_list_the_policies_then_read(
    tmp_path: Path, models_api: str
) -> None:
    home = tmp_path / "home"
    env = {"HANGAR_ANTHROPIC_BASE_URL": models_api, "ANTHROPIC_API_KEY": "test-key"}
    result = hangar("models", "refresh", "anthropic", home=home, env=env)
    assert result.returncode == 0, result.stderr
    assert "anthropic: 2 models" in result.stdout and _Models.keys[-2:] == ["test-key"] * 2
    cached = json.loads((home / "cache" / "models" / "anthropic.json").read_text())
    assert cached["models"] == ["claude-opus-9-20270202", "claude-sonnet-9-20270101"]

    shown = hangar("models", "show", "--json", home=home)
    assert shown.returncode == 0, shown.stderr
    policies = json.loads(shown.stdout)["anthropic"]["policies"]
    assert policies["frontier"] == {
        "model": "claude-opus-9-20270202",
        "basis": "list",
        "note": None,
    }
    assert policies["balanced"]["model"] == "claude-sonnet-9-20270101"

    no_key = hangar("models", "refresh", "openai", home=home, env={"OPENAI_API_KEY": ""})
    assert no_key.returncode == 1 and "OPENAI_API_KEY" in no_key.stderr


@pytest.mark.parametrize(
    "model", ["opus", "claude-opus-latest", "~anthropic/claude-sonnet-latest", "gpt-5", "my-model"]
)
def test_an_overlay_alias_is_refused_at_submit_and_kept_by_hangar_grade(
    example_dir: Path, hangar_home: Path, model: str
) -> None:
    # Regression: the spec's own check refused it, so `hangar grade` could not keep the alias.
    data = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    data["variants"] = {"ov": {"harness": "standin-plain", "model": model}}
    data.pop("baseline", None)  # the example's baseline names a variant this spec replaces
    path = example_dir / "overlay-alias.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as refused:
        submit(path, Settings.from_env())
    problems = {p.path: p.message for p in refused.value.problems}
    assert "floating model alias" in problems.get("variants.ov.model", ""), problems
    kept = resolve(load_spec(path), path, Settings.from_env())  # what `hangar grade` does
    assert kept.variants["ov"].model == model and kept.variants["ov"].model_concrete_basis is None
