"""Model policy: experiments run only concrete, dated model ids.

A floating alias (``opus``, ``sonnet``, ``gpt-5``, ``claude-*-latest``,
OpenRouter's ``~...-latest``, or an alias the orchestrator's environment
declares in ``HANGAR_MODEL_ALIASES``) can mean another model between two
trials, so an experiment that names one is refused. The policies ``balanced``
and ``frontier`` are not aliases: ``ModelCatalog`` resolves them once per
experiment to the newest dated id of a model family, read from the provider's
model list: ``$HANGAR_HOME/cache/models/<provider>.json`` (written by
``hangar models refresh``), else hangar's shipped snapshot
(``model_lists.json``). The id's basis is ``list`` when a list fetched from
the provider holds it (the stand-in's shipped list counts: hangar is its
provider) and ``pattern`` when only its dated shape vouches for it (the caller
notes why).
Ordinary jobs (``hangar grade``) keep aliases and record them as not concrete.
"""

from __future__ import annotations

import functools
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hangar_dagster.results.records import utcnow
from hangar_dagster.settings import ALIASES_VAR, HangarPaths, Settings
from hangar_dagster.util.fs import write_atomic

Basis = Literal["list", "pattern"]
POLICIES = ("balanced", "frontier")
SHIPPED = Path(__file__).with_name("model_lists.json")

# Provider aliases that move as new models ship, by the provider whose ids they stand for.
_ALIAS_PROVIDER = {
    "opus": "anthropic",
    "sonnet": "anthropic",
    "haiku": "anthropic",
    "opusplan": "anthropic",
    "gpt-5": "openai",
    "gpt-5-mini": "openai",
    "gpt-5-nano": "openai",
    "gpt-5-codex": "openai",
    "gpt-4o": "openai",
    "gpt-4.1": "openai",
    "o3": "openai",
    "o4-mini": "openai",
}
FLOATING_ALIASES = frozenset({*_ALIAS_PROVIDER, "default"})
_DATED = re.compile(r"(?<!\d)(20\d{2})-?([01]\d)-?([0-3]\d)(?!\d)")


class ModelListError(ValueError):
    """A model list or policy cannot be used; the message names the file or provider and the fix."""


@dataclass(frozen=True)
class ProviderApi:
    dialect: Literal["anthropic", "openai"]
    base_url_var: str
    default_base_url: str
    key_var: str


@dataclass(frozen=True)
class Provider:
    name: str
    ids: re.Pattern[str]  # what this provider's model ids look like
    families: dict[str, re.Pattern[str]]  # policy -> the ids it picks from (newest date wins)
    api: ProviderApi | None  # where `hangar models refresh` reads the list; None: shipped only


PROVIDERS: dict[str, Provider] = {
    "anthropic": Provider(
        "anthropic",
        re.compile(r"^claude-"),
        {
            "frontier": re.compile(r"^claude-(.+-)?opus-"),
            "balanced": re.compile(r"^claude-(.+-)?sonnet-"),
        },
        ProviderApi(
            "anthropic",
            "HANGAR_ANTHROPIC_BASE_URL",
            "https://api.anthropic.com",
            "ANTHROPIC_API_KEY",
        ),
    ),
    "openai": Provider(
        "openai",
        re.compile(r"^(gpt-|chatgpt-|codex-|o\d)"),
        {
            "frontier": re.compile(r"^gpt-5(\.\d+)?-\d{4}-\d{2}-\d{2}$"),
            "balanced": re.compile(r"^gpt-5(\.\d+)?-mini-\d{4}-\d{2}-\d{2}$"),
        },
        ProviderApi("openai", "HANGAR_OPENAI_BASE_URL", "https://api.openai.com", "OPENAI_API_KEY"),
    ),
    # hangar's scripted stand-in (no model): its one id is both policies, so the offline demo resolves.
    "standin": Provider(
        "standin",
        re.compile(r"^standin-"),
        {p: re.compile(r"^standin-scripted-") for p in POLICIES},
        None,
    ),
}
# Whose policies a bare `balanced` / `frontier` means, by the lock's agent.adapter.
ADAPTER_PROVIDER = {
    "claude-code": "anthropic",
    "codex": "openai",
    "mini-swe-agent": "openai",  # the adapter reaches models through the OpenAI API only
    "standin": "standin",
}


def floating_reason(model: str, aliases: frozenset[str]) -> str | None:
    """Why ``model`` is a floating alias, or None when it is a concrete, dated id.

    ``aliases`` are the ones the orchestrator's environment declares (``Settings.model_aliases``,
    ``HANGAR_MODEL_ALIASES``), lower case.
    """
    name = model.strip()
    low = name.lower()
    if not name:
        return "the model is empty"
    if low in aliases:
        return f"{name!r} is an alias this environment declares in {ALIASES_VAR}"
    if low in FLOATING_ALIASES:
        return f"{name!r} is a provider alias that moves as new models ship"
    if name.startswith("~") or low.endswith("-latest"):
        return f"{name!r} is a floating '-latest' alias"
    if not _DATED.search(name):
        return f"{name!r} carries no release date (expected e.g. claude-sonnet-4-5-20250929)"
    return None


def parse_policy(name: str) -> tuple[str | None, str] | None:
    """(provider or None, policy) for ``balanced``, ``frontier`` or ``<provider>:<policy>``; else None."""
    provider, sep, policy = name.strip().lower().rpartition(":")
    if policy not in POLICIES or (sep and provider not in PROVIDERS):
        return None
    return (provider or None), policy


def is_policy(name: str) -> bool:
    return parse_policy(name) is not None


def provider_of(model: str) -> str | None:
    """The provider an id (or alias) belongs to: ``anthropic/claude-...`` and ``~openai/...`` count."""
    name = model.strip().lstrip("~").lower()
    if name in _ALIAS_PROVIDER:
        return _ALIAS_PROVIDER[name]
    head, sep, rest = name.partition("/")
    if sep and head == "openrouter":
        head, sep, rest = rest.partition("/")
    if sep and head in PROVIDERS:
        return head
    bare = rest if sep else name
    return next((p.name for p in PROVIDERS.values() if p.ids.match(bare)), None)


def _release(model: str) -> str:
    found = _DATED.search(model)
    return "".join(found.groups()) if found else ""


def _newest(ids: frozenset[str], family: re.Pattern[str], aliases: frozenset[str]) -> str | None:
    dated = [m for m in ids if family.search(m) and floating_reason(m, aliases) is None]
    return max(dated, key=lambda m: (_release(m), m), default=None)


@functools.cache
def _shipped() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SHIPPED.read_text())
    return data


def cache_dir(p: HangarPaths) -> Path:
    """Where ``hangar models refresh`` keeps each provider's list."""
    return p.home / "cache" / "models"


@dataclass(frozen=True)
class ModelList:
    provider: str
    ids: frozenset[str]
    source: str  # the cache file and when it was fetched, or the shipped snapshot's date


@dataclass(frozen=True)
class ModelChoice:
    """What a requested model (id, policy or alias) resolved to."""

    requested: str
    model: str
    basis: Basis | None  # None: a floating alias (ordinary jobs only)
    note: str | None  # why the basis is pattern, or why the model is not concrete

    @property
    def concrete(self) -> bool:
        return self.basis is not None


@dataclass(frozen=True)
class ModelRefusal:
    message: str
    fix: str


@dataclass
class ModelCatalog:
    """Provider lists read once, and every choice made once: one catalog per experiment."""

    cache: Path | None
    aliases: frozenset[str]  # Settings.model_aliases: floating names this environment declares
    _lists: dict[str, ModelList | None] = field(default_factory=dict)
    _chosen: dict[tuple[str, str | None], ModelChoice] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Settings) -> ModelCatalog:
        return cls(cache_dir(settings.paths), settings.model_aliases)

    def list_for(self, provider: str) -> ModelList | None:
        if provider not in self._lists:
            self._lists[provider] = self._load(provider)
        return self._lists[provider]

    def _load(self, provider: str) -> ModelList | None:
        file = self.cache / f"{provider}.json" if self.cache else None
        if file is not None and file.is_file():
            try:
                data = json.loads(file.read_text())
                ids = data["models"]
                if not isinstance(ids, list) or not all(isinstance(m, str) for m in ids):
                    raise TypeError("models is not a list of ids")
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ModelListError(
                    f"{file}: not a model list ({err}); run `hangar models refresh {provider}` "
                    "or delete the file to use hangar's shipped list"
                ) from None
            return ModelList(provider, frozenset(ids), f"{file} (fetched {data.get('fetched_at')})")
        shipped = _shipped()["providers"].get(provider)
        # Only a list fetched from the provider is evidence for basis `list`; without one the
        # snapshot shipped with hangar is a fallback vouched for by date alone (pattern). The
        # stand-in's provider is hangar itself, so its shipped list is the provider's list.
        if shipped is None or provider != "standin":
            return None
        return ModelList(
            provider,
            frozenset(shipped),
            f"hangar's shipped {provider} list (as of {_shipped()['as_of']})",
        )

    def policy_id(self, provider: str, policy: str) -> tuple[str, Basis, str | None]:
        """The concrete id ``policy`` means at ``provider`` now, its basis and a note for pattern."""
        family = PROVIDERS[provider].families[policy]
        listed = self.list_for(provider)
        if listed is not None and (hit := _newest(listed.ids, family, self.aliases)):
            return hit, "list", None
        # A refreshed list without the family: the shipped snapshot names one, vouched only by its date.
        shipped = frozenset(_shipped()["providers"].get(provider, []))
        fallback = _newest(shipped, family, self.aliases)
        if fallback is None:
            raise ModelListError(
                f"policy {policy} ({provider}): no model list holds a model of its family "
                f"({family.pattern}); run `hangar models refresh {provider}`"
            )
        where = listed.source if listed is not None else f"no {provider} list"
        note = (
            f"policy {policy} ({provider}): {where} has no model of its family; took {fallback} "
            "from hangar's shipped list, so only its dated shape says it is concrete (basis pattern)"
        )
        return fallback, "pattern", note

    def choose(self, requested: str, adapter: str | None = None) -> ModelChoice:
        """Resolve a lock's or variant's model; the same question gets the same answer."""
        key = (requested, adapter)
        if key not in self._chosen:
            self._chosen[key] = self._choose(requested, adapter)
        return self._chosen[key]

    def _choose(self, requested: str, adapter: str | None) -> ModelChoice:
        policy = parse_policy(requested)
        if policy is not None:
            provider, name = policy
            provider = provider or ADAPTER_PROVIDER.get(adapter or "")
            if provider is None:
                raise ModelListError(
                    f"model {requested!r}: adapter {adapter!r} does not say whose {name} model it "
                    f"means; write {' or '.join(f'{p}:{name}' for p in PROVIDERS)}"
                )
            model, basis, note = self.policy_id(provider, name)
            return ModelChoice(requested, model, basis, note)
        if why := floating_reason(requested, self.aliases):
            return ModelChoice(requested, requested, None, why)
        provider = provider_of(requested)
        listed = self.list_for(provider) if provider else None
        if listed is not None and requested in listed.ids:
            return ModelChoice(requested, requested, "list", None)
        where = (
            f"is not in {listed.source}"
            if listed is not None
            else "is in no provider model list hangar knows"
        )
        note = (
            f"model {requested} {where}; only its dated shape says it is concrete (basis pattern)"
        )
        return ModelChoice(requested, requested, "pattern", note)

    def policies_now(self, provider: str | None) -> list[str]:
        """``<provider> <policy> -> <id>`` for each policy that resolves now (all providers if None)."""
        names = [provider] if provider in PROVIDERS else [p for p in PROVIDERS if p != "standin"]
        out = []
        for name in names:
            for policy in POLICIES:
                try:
                    model, _, _ = self.policy_id(str(name), policy)
                except ModelListError:
                    continue
                out.append(f"{name} {policy} -> {model}")
        return out

    def refusal(self, model: str, adapter: str | None = None) -> ModelRefusal | None:
        """Why an experiment may not run ``model``, naming what the policies resolve to now."""
        why = floating_reason(model, self.aliases)
        if why is None or is_policy(model):
            return None
        provider = provider_of(model) or ADAPTER_PROVIDER.get(adapter or "")
        now = self.policies_now(provider)
        return ModelRefusal(
            message=f"floating model alias: {why}; the policies resolve now to: "
            + (", ".join(now) or "nothing (no model list)"),
            fix="name a concrete, dated model id (e.g. one of those), or a policy "
            "(balanced, frontier) that hangar resolves once per experiment",
        )


def _get_json(url: str, headers: dict[str, str], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"accept": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ModelListError(f"GET {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ModelListError(f"GET {url}: {err}") from None
    except ValueError as err:
        raise ModelListError(f"GET {url}: not JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ModelListError(f"GET {url}: no `data` list in the answer")
    return data


def _fetch_ids(api: ProviderApi, base: str, key: str, timeout_s: float) -> list[str]:
    root = base.rstrip("/") + "/v1/models"
    if api.dialect == "openai":
        data = _get_json(root, {"authorization": f"Bearer {key}"}, timeout_s)
        return [str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m]
    ids: list[str] = []
    after: str | None = None
    for _ in range(100):  # Anthropic pages the list; 100 pages of 1000 is far beyond any provider
        url = f"{root}?limit=1000" + (f"&after_id={after}" if after else "")
        data = _get_json(url, {"x-api-key": key, "anthropic-version": "2023-06-01"}, timeout_s)
        ids += [str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m]
        after = data.get("last_id")
        if not data.get("has_more") or not after:
            break
    return ids


def refresh(provider: str, cache: Path, settings: Settings, timeout_s: float = 30) -> ModelList:
    """Fetch ``provider``'s model list from its API into the cache (the key goes only there)."""
    spec = PROVIDERS.get(provider)
    if spec is None or spec.api is None:
        known = ", ".join(p for p, s in PROVIDERS.items() if s.api)
        raise ModelListError(f"cannot refresh {provider!r}: hangar reads model lists from {known}")
    api = spec.api
    base = settings.provider_base_url(provider) or api.default_base_url
    key = settings.provider_key(provider)
    if not key:
        raise ModelListError(f"set {api.key_var} to list {provider}'s models from {base}")
    ids = sorted(set(_fetch_ids(api, base, key, timeout_s)))
    if not ids:
        raise ModelListError(f"{base}: the provider listed no models; the cache was left as it was")
    fetched = utcnow().isoformat(timespec="seconds")
    file = cache / f"{provider}.json"
    body = {"provider": provider, "source": base, "fetched_at": fetched, "models": ids}
    write_atomic(file, json.dumps(body, indent=2) + "\n")
    return ModelList(provider, frozenset(ids), f"{file} (fetched {fetched})")
