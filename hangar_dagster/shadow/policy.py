"""A shadow policy: which repository's merges a candidate harness is run on, and how.

``load_policy`` reads the YAML a user writes and raises ``SpecError`` listing every problem
by field path with its fix, as an experiment spec does; nothing is written for a refused
policy. ``register`` stores a checked policy under ``HANGAR_HOME/shadows/<name>/`` with its
cursor at the mainline's head, so only merges made after registration are shadowed.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hangar_dagster.experiment.harness import HarnessError, load_lock
from hangar_dagster.experiment.spec import (
    ID_PATTERN,
    MAX_TIMEOUT_S,
    MAX_TRIALS,
    Budget,
    Environment,
    Problem,
    SpecError,
    load_yaml_file,
    require_mapping,
    shown,
    structural_problems,
)
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.util.fs import write_atomic
from hangar_dagster.util.gitrepo import GitError, repo_location, resolve_base

POLICY = "policy.json"  # the checked policy, paths made absolute
STATE = "state.json"  # the cursor and every merge the sensor decided on
# A shadow experiment is named shadow-<policy> and its tasks m-<12 hex>: both must stay ids.
MAX_NAME = 30
DEFAULT_TESTS = ("tests/**", "test/**", "**/test_*.py", "**/*_test.py")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ShadowPaths(_Strict):
    include: list[str] = Field(
        default_factory=list,
        description="Globs: a merge is shadowed only if it changes a matching file "
        "(empty: every merge).",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="Globs of changed files left out: neither hidden tests nor reference.",
    )
    tests: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TESTS),
        description="Globs of test files: the ones a merge changed become its hidden tests.",
    )


class ShadowGrader(_Strict):
    """The grader settings of a shadow's experiment; its hidden tests come from each merge."""

    command: str = "hangar-grade pytest -q"
    network: Literal["none", "mirror"] = "none"
    timeout_s: int = Field(300, ge=1, le=MAX_TIMEOUT_S)
    pythonpath: list[str] = Field(default_factory=list)


class ShadowPolicy(_Strict):
    name: str = Field(..., description=f"Letters, digits, _ and -; at most {MAX_NAME}.")
    repo: str = Field(..., description="Git URL, or a path (relative to the policy file).")
    mainline: str = Field("main", min_length=1, description="The branch merges land on.")
    harness_lock: str = Field(..., description="The candidate: name@sha256:<digest>.")
    harness_repo: str | None = Field(
        None, description="Harness registry (relative to the policy); default $HANGAR_HARNESS_REPO."
    )
    sample_rate: float = Field(..., gt=0, le=1, allow_inf_nan=False)
    max_per_night: int = Field(..., ge=1, le=MAX_TRIALS)
    paths: ShadowPaths = Field(default_factory=ShadowPaths)
    grader: ShadowGrader = Field(default_factory=ShadowGrader)  # type: ignore[arg-type]
    environment: Environment = Field(default_factory=Environment)  # type: ignore[arg-type]
    verify: str | None = Field(None, description="The visible check the candidate may run.")
    author: str | None = None
    trial_job_budget: Budget | None = None
    parallel: int = Field(2, ge=1, le=256)


def _problems(policy: ShadowPolicy) -> list[Problem]:
    problems: list[Problem] = []
    if not re.fullmatch(ID_PATTERN, policy.name) or len(policy.name) > MAX_NAME:
        problems.append(
            Problem(
                path="name",
                message=f"{shown(policy.name)} is not a valid shadow name",
                fix=f"use letters, digits, _ and - (at most {MAX_NAME})",
            )
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*@sha256:[0-9a-f]{64}", policy.harness_lock):
        problems.append(
            Problem(
                path="harness_lock",
                message=f"{shown(policy.harness_lock)} is not name@sha256:<64 hex digits>",
                fix="copy the lock's full name from `hangar harness freeze` or the registry",
            )
        )
    if policy.environment.egress.mode != "none":
        problems.append(
            Problem(
                path="environment.egress.mode",
                message=f"a shadow runs with egress none, not {policy.environment.egress.mode!r}: "
                "the merged answer is reachable wherever the repository is",
                fix="remove environment.egress (shadows always run with none)",
            )
        )
    for field in ("include", "exclude", "tests"):
        for i, glob in enumerate(getattr(policy.paths, field)):
            if not glob or glob.startswith("/"):
                problems.append(
                    Problem(
                        path=f"paths.{field}[{i}]",
                        message=f"{shown(glob)} is not a relative glob",
                        fix="write a '/'-separated glob relative to the repository root, e.g. tests/**",
                    )
                )
    if not policy.paths.tests:
        problems.append(
            Problem(
                path="paths.tests",
                message="no glob names the test files",
                fix="leave paths.tests out (the defaults) or give at least one glob",
            )
        )
    return problems


def parse_policy(data: Any, source: str = "<policy>") -> ShadowPolicy:
    require_mapping(data, source, "policy", "name, repo, mainline, harness_lock")
    if isinstance(data.get("environment"), dict) and "egress" not in data["environment"]:
        # Shadows always run with none: written or not (a written other mode is refused).
        data = {**data, "environment": {**data["environment"], "egress": {"mode": "none"}}}
    elif "environment" not in data:
        data = {**data, "environment": {"egress": {"mode": "none"}}}
    try:
        policy = ShadowPolicy.model_validate(data)
    except ValidationError as err:
        raise SpecError(source, structural_problems(err)) from None
    if problems := _problems(policy):
        raise SpecError(source, problems)
    return policy


def load_policy(path: Path) -> ShadowPolicy:
    """Read and check a policy file; ``repo`` and ``harness_repo`` become absolute."""
    policy = parse_policy(load_yaml_file(path, "shadow policy"), str(path))
    here = path.resolve().parent
    return policy.model_copy(
        update={
            "repo": repo_location(policy.repo, here),
            "harness_repo": str((here / policy.harness_repo).resolve())
            if policy.harness_repo
            else None,
        }
    )


def matches(path: str, globs: list[str]) -> bool:
    """Whether a repository path matches one of ``globs`` (``**/`` also matches at the root)."""
    for glob in globs:
        if fnmatch.fnmatchcase(path, glob):
            return True
        if glob.startswith("**/") and fnmatch.fnmatchcase(path, glob[3:]):
            return True
    return False


class MergeDecision(BaseModel):
    """What the sensor decided for one merge on the mainline (kept, or dropped and why)."""

    sha: str
    subject: str
    seen_at: dt.datetime
    night: str  # the eval night (the window's opening date, local) it was counted in
    kept: bool
    reason: str | None = None  # why it was dropped: a code (docs/architecture.md, "Shadows")
    detail: str | None = None
    task: str | None = None
    experiment_id: str | None = None
    test_files: list[str] = Field(default_factory=list)


class CursorReset(BaseModel):
    """The cursor was gone from the repository (a force-push and a prune): it moved to the
    tip, and the merges between were not looked at."""

    at: dt.datetime
    lost: str  # the cursor that was gone
    to: str  # the tip it was set to
    detail: str


class ShadowState(BaseModel):
    cursor: str  # the last mainline commit the sensor looked at
    registered_at: dt.datetime
    merges: list[MergeDecision] = Field(default_factory=list)
    resets: list[CursorReset] = Field(default_factory=list)


def policy_dir(paths: HangarPaths, name: str) -> Path:
    return paths.shadows / name


def read_policy(paths: HangarPaths, name: str) -> ShadowPolicy:
    return ShadowPolicy.model_validate_json((policy_dir(paths, name) / POLICY).read_text())


def read_state(paths: HangarPaths, name: str) -> ShadowState:
    return ShadowState.model_validate_json((policy_dir(paths, name) / STATE).read_text())


def write_state(paths: HangarPaths, name: str, state: ShadowState) -> None:
    write_atomic(policy_dir(paths, name) / STATE, state.model_dump_json(indent=2))


def registered(paths: HangarPaths) -> list[str]:
    """The registered policies' names (a folder whose policy was written whole)."""
    if not paths.shadows.is_dir():
        return []
    return sorted(d.name for d in paths.shadows.iterdir() if (d / STATE).is_file())


def registry_of(policy: ShadowPolicy, settings: Settings) -> Path | None:
    if policy.harness_repo:
        return Path(policy.harness_repo)
    return Path(settings.harness_repo).resolve() if settings.harness_repo else None


def register(policy: ShadowPolicy, settings: Settings, now: dt.datetime) -> ShadowState:
    """Store ``policy`` with its cursor at the mainline's head; SpecError when the world
    disagrees (repository, branch, harness lock), having written nothing."""
    problems: list[Problem] = []
    paths = settings.paths
    if (policy_dir(paths, policy.name) / STATE).exists():
        problems.append(
            Problem(
                path="name",
                message=f"a shadow named {policy.name!r} is registered",
                fix=f"`hangar shadow remove {policy.name}` first, or choose another name",
            )
        )
    head = ""
    try:
        head = resolve_base(policy.repo, policy.mainline)
    except GitError as err:
        problems.append(
            Problem(
                path="mainline",
                message=str(err),
                fix="name the branch merges land on, in a repository that exists",
            )
        )
    registry = registry_of(policy, settings)
    if registry is None:
        problems.append(
            Problem(
                path="harness_repo",
                message="no harness registry is set",
                fix="set harness_repo in the policy or the HANGAR_HARNESS_REPO environment variable",
            )
        )
    else:
        try:
            load_lock(registry, policy.harness_lock)
        except HarnessError as err:
            problems.append(
                Problem(
                    path="harness_lock",
                    message=str(err),
                    fix="freeze the candidate (`hangar harness freeze`) and use its name",
                )
            )
    if problems:
        raise SpecError(policy.name, problems)
    state = ShadowState(cursor=head, registered_at=now)
    where = policy_dir(paths, policy.name)
    write_atomic(where / POLICY, policy.model_dump_json(indent=2))
    write_state(paths, policy.name, state)  # last: its presence is what registers it
    return state


def remove(paths: HangarPaths, name: str) -> bool:
    """Unregister ``name``: the sensor stops; its experiments and their rows stay."""
    where = policy_dir(paths, name)
    if not (where / STATE).exists():
        return False
    (where / STATE).unlink()
    shutil.rmtree(where, ignore_errors=True)
    return True
