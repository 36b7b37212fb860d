"""``hangar harness``: freeze, thaw and show harness locks in a registry (harness.py).

The registry is ``--registry DIR``, else ``HANGAR_HARNESS_REPO``. ``freeze``
prints the lock's name (``name@sha256:<digest>``) and nothing else on stdout,
so scripts can take it; warnings (a floating model, a CLI version the
registry's ``harnesses.lock.yaml`` does not pin) go to stderr: submit refuses
those, freezing does not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from hangar_dagster.experiment.harness import (
    HarnessError,
    HarnessLock,
    find_ref,
    freeze,
    load_lock,
    read_cli_pins,
    thaw,
)
from hangar_dagster.experiment.model_policy import ModelCatalog, ModelListError, is_policy
from hangar_dagster.settings import HARNESS_REPO_VAR, Settings

REGISTRY_VAR = HARNESS_REPO_VAR

app = typer.Typer(
    no_args_is_help=True, help="Harness locks: freeze a configuration, thaw one, show one."
)
err = Console(stderr=True, soft_wrap=True)  # whole lines: refs and paths stay greppable

RegistryOption = Annotated[
    Path | None,
    typer.Option("--registry", help=f"The harness registry directory (default ${REGISTRY_VAR})."),
]


def _registry(option: Path | None) -> Path:
    if option is not None:
        return option.resolve()
    env = Settings.from_env().harness_repo
    if env:
        return Path(env).resolve()
    err.print(f"[red]refused:[/] no harness registry: pass --registry DIR or set {REGISTRY_VAR}")
    raise typer.Exit(2)


def _refuse(e: Exception) -> typer.Exit:
    err.print(f"[red]refused:[/] {escape(str(e))}")
    return typer.Exit(2)


def _model(lock: HarnessLock, catalog: ModelCatalog) -> dict[str, Any]:
    out: dict[str, Any] = {"requested": lock.model, "policy": is_policy(lock.model)}
    try:
        choice = catalog.choose(lock.model, lock.adapter)
    except ModelListError as e:
        return out | {"error": str(e)}
    refused = catalog.refusal(choice.model, lock.adapter)
    return out | {
        "resolves_to": choice.model,
        "concrete": choice.concrete,
        "basis": choice.basis,
        "note": choice.note,
        "experiments_refuse": refused.message if refused else None,
    }


def describe(lock: HarnessLock, registry: Path) -> dict[str, Any]:
    """What a lock holds, as JSON-able data (``hangar harness show --json``)."""
    instructions = lock.instructions_file
    pins = read_cli_pins(registry)
    problem = pins.problem(lock) if pins else None
    return {
        "ref": lock.ref,
        "name": lock.name,
        "digest": f"sha256:{lock.digest}",
        "path": str(lock.path),
        "agent": lock.config["agent"],
        "model": _model(lock, ModelCatalog.of(Settings.from_env())),
        "approvals": lock.config.get("approvals"),
        "instructions": None
        if instructions is None
        else {
            "file": instructions.name,
            "sha256": hashlib.sha256(instructions.read_bytes()).hexdigest(),
        },
        "skills": sorted(p.name for p in lock.skills_dir.iterdir())
        if lock.skills_dir.is_dir()
        else [],
        "plugins": sorted(p.name for p in lock.plugins_dir.iterdir())
        if lock.plugins_dir.is_dir()
        else [],
        "files": sorted(str(p.relative_to(lock.path)) for p in lock.path.rglob("*") if p.is_file()),
        "cli_pin": None
        if pins is None
        else {
            "file": str(pins.file),
            "pinned": pins.clis.get(lock.cli),
            "problem": problem[0] if problem else None,
        },
    }


@app.command("freeze")
def freeze_cmd(
    src: Annotated[Path, typer.Argument(help="A harness directory holding harness.yaml.")],
    registry: RegistryOption = None,
) -> None:
    """Write SRC as a lock into the registry and print its name (name@sha256:<digest>)."""
    target = _registry(registry)
    try:
        lock = freeze(src, target)
        info = describe(lock, target)
    except (HarnessError, ModelListError) as e:
        raise _refuse(e) from None
    model = info["model"]
    if why := model.get("experiments_refuse") or model.get("error"):
        err.print(escape(f"warning: experiments will refuse this lock's model: {why}"))
    if info["cli_pin"] and info["cli_pin"]["problem"]:
        err.print(escape(f"warning: submit will refuse this lock: {info['cli_pin']['problem']}"))
    print(lock.ref)


@app.command("thaw")
def thaw_cmd(
    ref: Annotated[str, typer.Argument(help="name@sha256:<digest>, or a name with one lock.")],
    out: Annotated[Path, typer.Option("--out", help="A new (or empty) directory to write into.")],
    registry: RegistryOption = None,
) -> None:
    """Write a verified, read-only copy of lock REF to --out (files 0444, directories 0555)."""
    source = _registry(registry)
    try:
        lock = thaw(source, find_ref(source, ref), out.resolve())
    except HarnessError as e:
        raise _refuse(e) from None
    print(f"thawed {lock.ref} read-only at {lock.path}")


@app.command("show")
def show_cmd(
    ref: Annotated[str, typer.Argument(help="name@sha256:<digest>, or a name with one lock.")],
    registry: RegistryOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the lock as JSON.")] = False,
) -> None:
    """Verify lock REF and show its agent, model (and what a policy resolves to), skills and files."""
    source = _registry(registry)
    try:
        info = describe(load_lock(source, find_ref(source, ref)), source)
    except (HarnessError, ModelListError) as e:
        raise _refuse(e) from None
    if as_json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return
    agent, model = info["agent"], info["model"]
    lines = [
        f"{info['ref']}  (verified)",
        f"  agent: {agent['adapter']} ({agent['cli']} {agent['version']})",
        f"  model: {model['requested']}"
        + (
            f" -> {model['resolves_to']}"
            if model.get("resolves_to") not in (None, model["requested"])
            else ""
        )
        + (f" (basis {model['basis']})" if model.get("basis") else " (not concrete)"),
        f"  approvals: {info['approvals'] or '-'}",
        f"  instructions: {info['instructions']['file'] if info['instructions'] else '-'}",
        f"  skills: {', '.join(info['skills']) or '-'}",
        f"  plugins: {', '.join(info['plugins']) or '-'}",
        f"  files: {len(info['files'])}",
    ]
    if pin := info["cli_pin"]:
        matches = f"{agent['cli']} {pin['pinned']} (matches)"
        lines.append(f"  cli pin: {pin['problem'] or matches}")
    for note in (model.get("note"), model.get("experiments_refuse"), model.get("error")):
        if note:
            lines.append(f"  note: {note}")
    print("\n".join(lines))
