"""The experiment spec: what a user writes, as a pydantic model.

``load_spec`` parses and checks a YAML file and raises ``SpecError`` listing
every problem by field path with how to fix it; nothing is written for a
refused spec. ``experiment.schema.json`` is generated from ``ExperimentSpec``
(``hangar experiment schema``) and a test keeps the committed copy fresh.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
_ID = re.compile(ID_PATTERN)

OVERLAY_FIELDS = (
    "harness",
    "model",
    "approvals",
    "skills",
    "skills_remove",
    "instructions",
    "instructions_append",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Egress(_Strict):
    mode: Literal["none", "allowlist", "mirror"] = Field(
        "none",
        description="none: no network at all; allowlist: model API and package mirror only; "
        "mirror: package mirror only. The local sandbox enforces none.",
    )


class Resources(_Strict):
    timeout_s: int = Field(600, ge=1, description="Wall-clock limit of one agent run.")
    memory_mb: int = Field(4096, ge=64, description="Memory limit of the trial sandbox.")


class Environment(_Strict):
    sandbox: Literal["bwrap", "unshare"] = Field(
        "bwrap", description="Sandbox backend a trial runs in (see docs/architecture.md)."
    )
    image: str | None = Field(None, description="Container image by digest (Docker/K8s backends).")
    build: list[str] = Field(
        default_factory=list, description="Commands run once in the clone before the agent starts."
    )
    egress: Egress = Field(default_factory=Egress)  # type: ignore[arg-type]
    resources: Resources = Field(default_factory=Resources)  # type: ignore[arg-type]
    isolation: Literal["namespaces"] = "namespaces"


class Grader(_Strict):
    command: str = Field(
        "hangar-grade pytest -q",
        description="Runs in the patched repo; hidden tests are in $HANGAR_HIDDEN_TESTS.",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Hidden test files for every task ({relative path: content}); "
        "a task's hidden_tests add to them.",
    )
    network: Literal["none", "mirror"] = "none"
    files_mode: Literal["hidden", "in_repo"] = Field(
        "hidden", description="in_repo is the old layout (files written into the repo): trust low."
    )
    canary: str | None = Field(
        None, description="Generated per experiment when unset; never reuse one."
    )
    timeout_s: int = Field(300, ge=1)
    pythonpath: list[str] = Field(
        default_factory=list,
        description="Directories of the repo (relative to its root, e.g. src for a src/ layout) "
        "that hangar-grade puts first on the hidden tests' sys.path, before the repo root; "
        "also given to the command as $HANGAR_PYTHONPATH.",
    )

    @field_validator("pythonpath")
    @classmethod
    def _inside_repo(cls, dirs: list[str]) -> list[str]:
        for d in dirs:
            parts = d.split("/")
            if not d or d.startswith("/") or ".." in parts or "\\" in d or ":" in d:
                raise ValueError(
                    f"pythonpath entry {d!r} must be a directory inside the repo: relative, "
                    "'/'-separated, without '..' or ':' (e.g. src)"
                )
        return dirs


class Task(_Strict):
    id: str = Field(..., description="Unique within the experiment; letters, digits, _ and -.")
    instructions: str = Field(..., min_length=1)
    repo: str = Field(..., description="Git URL, or a path (relative to the spec file).")
    base: str = Field(
        ..., min_length=1, description="Commit, tag or branch; resolved to a full SHA at submit."
    )
    verify: str | None = Field(None, description="The visible check the agent may run.")
    reference_patch: str | None = Field(
        None,
        description="A known fix the hidden tests must pass: diff text (several lines) "
        "or a path to a .diff file relative to the spec.",
    )
    hidden_tests: dict[str, str] | str | None = Field(
        None,
        description="Hidden test files for this task: {relative path: content}, "
        "or a directory relative to the spec.",
    )


class Variant(_Strict):
    harness_lock: str | None = Field(
        None, description="name@sha256:<digest> in the harness registry."
    )
    environment: Environment | None = None
    tasks: list[str] | None = Field(None, description="Run only these tasks (default: all).")
    # The deprecated overlay form (issue #4 runs it; each use gets a deprecation note).
    harness: str | None = Field(None, json_schema_extra={"deprecated": True})
    model: str | None = Field(None, json_schema_extra={"deprecated": True})
    approvals: str | None = Field(None, json_schema_extra={"deprecated": True})
    skills: list[str] | None = Field(None, json_schema_extra={"deprecated": True})
    skills_remove: list[str] | None = Field(None, json_schema_extra={"deprecated": True})
    instructions: str | None = Field(None, json_schema_extra={"deprecated": True})
    instructions_append: str | None = Field(None, json_schema_extra={"deprecated": True})

    def overlay_fields(self) -> list[str]:
        return [f for f in OVERLAY_FIELDS if getattr(self, f) is not None]


class Budget(_Strict):
    max_cost_usd: float = Field(..., gt=0)


class ExperimentSpec(_Strict):
    """An experiment: the same tasks under several variants, several trials each."""

    name: str = Field(..., description="Short name; letters, digits, _ and -.")
    description: str | None = None
    author: str | None = Field(None, description="Defaults to $USER at submit.")
    harness_repo: str | None = Field(
        None,
        description="Harness registry directory (relative to the spec); default $HANGAR_HARNESS_REPO.",
    )
    environment: Environment = Field(default_factory=Environment)  # type: ignore[arg-type]
    tasks: Annotated[list[Task], Field(min_length=1)]
    variants: Annotated[dict[str, Variant], Field(min_length=1)]
    trials: int = Field(1, ge=1, description="Trials per variant and task.")
    parallel: int = Field(2, ge=1, description="Most trials of this experiment in flight at once.")
    grader: Grader = Field(default_factory=Grader)  # type: ignore[arg-type]
    trial_job_budget: Budget | None = None
    budget: Budget | None = None


class Problem(BaseModel):
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} -> {self.fix}"


class SpecError(Exception):
    """A spec that cannot run; ``problems`` lists every reason, each with its fix."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s), nothing was submitted:\n{lines}")


_FIXES = {
    "missing": "add this field",
    "extra_forbidden": "remove it, or check its spelling against experiment.schema.json",
    "greater_than_equal": "use a larger number",
    "greater_than": "use a larger number",
    "too_short": "give at least one entry",
    "string_type": "write it as a string",
    "int_parsing": "write a whole number",
    "literal_error": "use one of the allowed values",
}


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _structural(err: ValidationError) -> list[Problem]:
    problems: list[Problem] = []
    for e in err.errors():
        # A union (hidden_tests) reports each arm; the first is enough to fix it.
        loc = tuple(p for p in e["loc"] if p not in ("str", "dict[str,str]"))
        path = _loc(loc)
        if any(p.path == path for p in problems):
            continue
        problems.append(
            Problem(
                path=path, message=e["msg"], fix=_FIXES.get(e["type"], "see experiment.schema.json")
            )
        )
    return problems


def semantic_problems(spec: ExperimentSpec) -> list[Problem]:
    """Rules that cross fields; every one reported, not just the first."""
    problems: list[Problem] = []
    if not _ID.match(spec.name):
        problems.append(
            Problem(
                path="name",
                message=f"{spec.name!r} is not a valid name",
                fix="use letters, digits, _ and - (at most 48)",
            )
        )
    seen: set[str] = set()
    for i, task in enumerate(spec.tasks):
        if not _ID.match(task.id):
            problems.append(
                Problem(
                    path=f"tasks[{i}].id",
                    message=f"{task.id!r} is not a valid task id",
                    fix="use letters, digits, _ and - (at most 48)",
                )
            )
        if task.id in seen:
            problems.append(
                Problem(
                    path=f"tasks[{i}].id",
                    message=f"duplicate task id {task.id!r}",
                    fix="give every task its own id",
                )
            )
        seen.add(task.id)
    for name, variant in spec.variants.items():
        where = f"variants.{name}"
        if not _ID.match(name):
            problems.append(
                Problem(
                    path=where,
                    message=f"{name!r} is not a valid variant name",
                    fix="use letters, digits, _ and - (at most 48)",
                )
            )
        overlay = variant.overlay_fields()
        if variant.harness_lock is not None and overlay:
            problems.append(
                Problem(
                    path=where,
                    message=f"harness_lock cannot be combined with overlay field(s) {', '.join(overlay)}",
                    fix="put those settings into the harness lock, or drop harness_lock and use the (deprecated) overlay",
                )
            )
        if variant.harness_lock is not None and not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9._-]*@sha256:[0-9a-f]{64}", variant.harness_lock
        ):
            problems.append(
                Problem(
                    path=f"{where}.harness_lock",
                    message=f"{variant.harness_lock!r} is not name@sha256:<64 hex digits>",
                    fix="copy the lock's full name from `hangar harness freeze` or the registry",
                )
            )
        for j, t in enumerate(variant.tasks or []):
            if t not in seen:
                problems.append(
                    Problem(
                        path=f"{where}.tasks[{j}]",
                        message=f"unknown task {t!r}",
                        fix=f"use one of: {', '.join(sorted(seen))}",
                    )
                )
    return problems


def parse_spec(data: Any, source: str = "<spec>") -> ExperimentSpec:
    if not isinstance(data, dict):
        raise SpecError(
            source,
            [
                Problem(
                    path="(top level)",
                    message="the spec is not a mapping",
                    fix="write the spec as YAML keys: name, tasks, variants, ...",
                )
            ],
        )
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(source, _structural(err)) from None
    problems = semantic_problems(spec)
    if problems:
        raise SpecError(source, problems)
    return spec


def load_spec(path: Path) -> ExperimentSpec:
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(
            str(path),
            [
                Problem(
                    path="(file)",
                    message=f"cannot read the spec: {err.strerror}",
                    fix="check the path",
                )
            ],
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(
            str(path),
            [
                Problem(
                    path="(file)",
                    message=f"not valid YAML: {err}",
                    fix="fix the YAML syntax at the position shown",
                )
            ],
        ) from None
    return parse_spec(data, str(path))


def json_schema() -> dict[str, Any]:
    schema = ExperimentSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hangar_dagster experiment spec"
    return schema
