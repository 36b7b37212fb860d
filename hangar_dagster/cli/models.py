"""``hangar models``: the provider model lists the ``balanced`` / ``frontier`` policies read.

``refresh`` fetches a provider's list (``GET /v1/models`` with the key from
``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY``, at ``HANGAR_ANTHROPIC_BASE_URL`` /
``HANGAR_OPENAI_BASE_URL``) into ``$HANGAR_HOME/cache/models/<provider>.json``;
``show`` prints which list each provider uses and what the policies resolve to.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from hangar_dagster.experiment.model_policy import (
    POLICIES,
    PROVIDERS,
    ModelCatalog,
    ModelListError,
    cache_dir,
    refresh,
)
from hangar_dagster.settings import Settings

app = typer.Typer(
    no_args_is_help=True, help="Provider model lists and the balanced / frontier policies."
)
err = Console(stderr=True, soft_wrap=True)  # whole lines: refs and paths stay greppable
REFRESHABLE = [name for name, p in PROVIDERS.items() if p.api is not None]


@app.command("refresh")
def refresh_cmd(
    providers: Annotated[
        list[str] | None,
        typer.Argument(help=f"Providers to refresh (default: {', '.join(REFRESHABLE)})."),
    ] = None,
) -> None:
    """Fetch each provider's current model list into the cache."""
    failed = 0
    settings = Settings.from_env()
    for provider in providers or REFRESHABLE:
        try:
            listed = refresh(provider, cache_dir(settings.paths), settings)
        except ModelListError as e:
            err.print(f"[red]{escape(provider)}:[/] {escape(str(e))}")
            failed += 1
            continue
        print(f"{provider}: {len(listed.ids)} models -> {listed.source}")
    if failed:
        raise typer.Exit(1)


@app.command("show")
def show_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Which list each provider's policies read now, and the ids they resolve to."""
    catalog = ModelCatalog.of(Settings.from_env())
    out: dict[str, Any] = {}
    for provider in PROVIDERS:
        try:
            listed = catalog.list_for(provider)
            policies = {}
            for policy in POLICIES:
                model, basis, note = catalog.policy_id(provider, policy)
                policies[policy] = {"model": model, "basis": basis, "note": note}
        except ModelListError as e:
            out[provider] = {"error": str(e)}
            continue
        out[provider] = {
            "source": listed.source if listed else None,
            "models": len(listed.ids) if listed else 0,
            "policies": policies,
        }
    if as_json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    for provider, info in out.items():
        print(f"{provider}: {info.get('error') or info['source']}")
        for policy, chosen in info.get("policies", {}).items():
            print(f"  {policy} -> {chosen['model']} (basis {chosen['basis']})")
