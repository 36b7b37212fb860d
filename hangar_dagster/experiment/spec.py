"""The experiment spec: what a user writes, as a pydantic model.

``load_spec`` parses and checks a YAML file and raises ``SpecError`` listing
every problem by field path with how to fix it; nothing is written for a
refused spec. ``experiment.schema.json`` is generated from ``ExperimentSpec``
(``hangar experiment schema``) and a test keeps the committed copy fresh.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
import zoneinfo
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from hangar_dagster.experiment.spec_yaml import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_NODES,
    MAX_NUMBER_CHARS,
    YAMLRefusal,
    load_yaml,
)
from hangar_dagster.util.fs import InputFileError, read_text_bounded

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
_ID = re.compile(ID_PATTERN)

# Input bounds (docs/operations.md, "Input bounds"): every number a spec can make hangar
# allocate, wait for or read is capped, so a typo is refused instead of run.
MAX_TRIALS = 1000
MAX_PARALLEL = 256
MAX_TIMEOUT_S = 86_400  # a day, for an agent run or a grader run
MAX_MEMORY_MB = 1_048_576  # 1 TiB
MAX_BUDGET_USD = 1_000_000
MAX_PLANNED_TRIALS = 100_000  # trials x tasks x variants
MAX_SPEC_BYTES = 1 << 20  # 1 MiB
MAX_PATCH_BYTES = 10 << 20  # 10 MiB, a reference patch or `hangar grade --patch`
MAX_HIDDEN_BYTES = 2_000_000  # all hidden test files of one task (they go into resolved.json)
MAX_HIDDEN_FILES = 1000  # files in one hidden_tests directory
DEFAULT_REUSE_MAX_AGE_DAYS = 7.0  # a week: last night's and last week's trials, not last month's
MAX_REUSE_AGE_DAYS = 365

# The table docs/operations.md and experiment.schema.json ("x-input-bounds") show.
INPUT_BOUNDS: dict[str, tuple[int, str]] = {
    "trials": (MAX_TRIALS, "trials per variant and task"),
    "parallel": (MAX_PARALLEL, "trials in flight at once"),
    "timeout_s": (MAX_TIMEOUT_S, "seconds, environment.resources.timeout_s and grader.timeout_s"),
    "memory_mb": (MAX_MEMORY_MB, "MB (1 TiB), environment.resources.memory_mb"),
    "max_cost_usd": (MAX_BUDGET_USD, "USD, budget and trial_job_budget"),
    "max_age_days": (
        MAX_REUSE_AGE_DAYS,
        "days, reuse.max_age_days (how old a reused trial may be)",
    ),
    "planned_trials": (MAX_PLANNED_TRIALS, "trials x tasks x variants of one spec"),
    "spec_bytes": (MAX_SPEC_BYTES, "bytes (1 MiB) of the spec file"),
    "patch_bytes": (MAX_PATCH_BYTES, "bytes (10 MiB) of a reference_patch file or --patch"),
    "hidden_bytes": (MAX_HIDDEN_BYTES, "bytes of one task's hidden test files, each and in all"),
    "hidden_files": (MAX_HIDDEN_FILES, "files in one hidden_tests directory"),
    "yaml_depth": (MAX_DEPTH, "levels of YAML nesting, aliases expanded"),
    "yaml_aliases": (MAX_ALIASES, "YAML aliases (*name) in the spec"),
    "yaml_values": (MAX_NODES, "YAML values once aliases are expanded"),
    "yaml_number_chars": (MAX_NUMBER_CHARS, "characters of one number in the spec"),
}

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
    # strict: `trials: true`, `parallel: 1e9` (YAML reads it as a string) or 2.0 are refused,
    # not coerced to 1 or 1000000000.
    model_config = ConfigDict(extra="forbid", strict=True)


def control_character(text: str) -> str | None:
    """The first control or invisible format character in ``text`` (as U+XXXX), or None."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"U+{ord(ch):04X}"
    return None


def hidden_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a hidden file's name, or None when it can."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or str(p) in ("", "."):
        return (
            f"hidden file path {shown(path)} must be relative, inside the hidden tests directory, "
            "without '..'"
        )
    if bad := control_character(path):
        return f"hidden file path {shown(path)} holds the control character {bad}"
    return None


def _file_names(files: dict[str, str]) -> dict[str, str]:
    for name in files:
        if problem := hidden_path_problem(name):
            raise PydanticCustomError("hidden_path", problem)
    return files


class Egress(_Strict):
    mode: Literal["none", "allowlist", "mirror"] = Field(
        "allowlist",
        description="none: nothing beyond the sandbox's loopback (an agent still reaches its "
        "model through the model proxy); allowlist (the default): the model API through the "
        "model proxy and the package mirror; mirror: the package mirror only. Enforced by one "
        "egress proxy per sandbox; every request is a line in the trial's egress.jsonl.",
    )


class Resources(_Strict):
    timeout_s: int = Field(
        600, ge=1, le=MAX_TIMEOUT_S, description="Wall-clock limit of one agent run."
    )
    memory_mb: int = Field(
        4096, ge=64, le=MAX_MEMORY_MB, description="Memory limit of the trial sandbox."
    )


class Environment(_Strict):
    sandbox: Literal["bwrap", "unshare", "docker", "k8s"] = Field(
        "bwrap",
        description="Sandbox backend a trial runs in (see docs/architecture.md); k8s: a pod "
        "per sandbox run through the Kubernetes API (docs/operations.md, Kubernetes).",
    )
    image: str | None = Field(
        None,
        description="Container image by digest (Docker, Kubernetes): repo@sha256:... or a "
        "local image id sha256:... (`hangar image build` prints one); a tag is refused at "
        "submit. For k8s the project image hangar runs in, as the cluster's nodes pull it.",
    )
    build: list[str] = Field(
        default_factory=list,
        description="Build steps (e.g. pip install -e .), run once per task base in a "
        "virtualenv with the package mirror only; the venv is mounted read-only into every "
        "trial and grader of the task (see docs/architecture.md, Builds).",
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
    timeout_s: int = Field(300, ge=1, le=MAX_TIMEOUT_S)
    pythonpath: list[str] = Field(
        default_factory=list,
        description="Directories of the repo (relative to its root, e.g. src for a src/ layout) "
        "that hangar-grade puts first on the hidden tests' sys.path, before the repo root; "
        "also given to the command as $HANGAR_PYTHONPATH.",
    )

    _files = field_validator("files")(_file_names)

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
    build: list[str] = Field(
        default_factory=list,
        description="This task's own build steps, run after environment.build in the same "
        "build (e.g. pip install six==1.16.0).",
    )

    @field_validator("hidden_tests")
    @classmethod
    def _hidden_names(cls, v: dict[str, str] | str | None) -> dict[str, str] | str | None:
        return _file_names(v) if isinstance(v, dict) else v


class Variant(_Strict):
    harness_lock: str | None = Field(
        None, description="name@sha256:<digest> in the harness registry."
    )
    changes: str | None = Field(
        None,
        min_length=1,
        description="The one thing this variant changes against the baseline, in words "
        "(e.g. 'adds the general-fix skill'); the report's Changed line starts with it.",
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


class Decide(_Strict):
    """The decision rule a result is read against (the report's Learned line)."""

    min_effect_pts: float = Field(
        ...,
        gt=0,
        le=100,
        allow_inf_nan=False,
        description="The smallest difference against the baseline, in points out of 100, "
        "that would change what you do: shown when the paired difference's 95% interval lies "
        "above it, not shown when it lies below it, undecided otherwise.",
    )
    rule: str | None = Field(
        None,
        min_length=1,
        description="The decision in words, e.g. 'adopt the skill if it wins by 10 points'.",
    )


class Budget(_Strict):
    max_cost_usd: float = Field(..., gt=0, le=MAX_BUDGET_USD, allow_inf_nan=False)


class Reuse(_Strict):
    """Reuse of measured trials of earlier experiments (docs/architecture.md, "Reusing trials")."""

    enabled: bool = Field(
        True,
        description="Reuse a finished trial of an earlier experiment (not run, not paid) when "
        "everything that decides its outcome is identical; false: every trial runs.",
    )
    max_age_days: float = Field(
        DEFAULT_REUSE_MAX_AGE_DAYS,
        gt=0,
        le=MAX_REUSE_AGE_DAYS,
        allow_inf_nan=False,
        description="Only trials measured at most this many days before submit are reused.",
    )


_AT = re.compile(r"^([0-9]{2}):([0-9]{2})$")
AT_FIX = 'write the local time as a quoted "HH:MM" (24-hour), e.g. at: "19:30"'
ZONE_FIX = "write an IANA zone name such as America/New_York or UTC"


def parse_at(value: str) -> dt.time:
    """``HH:MM`` (24-hour) as a time of day; ValueError saying what is wrong."""
    match = _AT.match(value)
    if match is None:
        raise ValueError(f"{shown(value)} is not HH:MM")
    hour, minute = int(match[1]), int(match[2])
    if hour > 23 or minute > 59:
        raise ValueError(f"{shown(value)}: hours must be 00-23 and minutes 00-59")
    return dt.time(hour, minute)


def parse_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``; ValueError when zoneinfo does not know it."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{shown(name)} is not a known time zone") from None


class Nightly(_Strict):
    """A schedule: `hangar experiment schedule SPEC` submits a fresh experiment of this spec each
    night at ``at`` (docs/queue.md, "Nightly experiments")."""

    at: str = Field(
        ...,
        description='Local time of day the night\'s experiment is submitted, "HH:MM" (24-hour, '
        "quoted: YAML reads an unquoted 19:30 as a number); before the eval window opens.",
    )
    timezone: str = Field(
        ..., description="IANA time zone of at, e.g. America/New_York (Dagster's cron rules)."
    )

    @field_validator("at", mode="before")
    @classmethod
    def _time_of_day(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            # YAML 1.1 reads 19:30 as sexagesimal 1170; a bare 1930 is no time either.
            raise PydanticCustomError(
                "nightly_at",
                f"{value} is a number, not a time (YAML reads an unquoted 19:30 as 1170)",
            )
        if isinstance(value, str):
            try:
                parse_at(value)
            except ValueError as e:
                raise PydanticCustomError("nightly_at", str(e)) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            parse_zone(value)
        except ValueError as e:
            raise PydanticCustomError("time_zone", str(e)) from None
        return value

    @property
    def time(self) -> dt.time:
        return parse_at(self.at)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return parse_zone(self.timezone)


class ExperimentSpec(_Strict):
    """An experiment: the same tasks under several variants, several trials each."""

    name: str = Field(..., description="Short name; letters, digits, _ and -.")
    description: str | None = None
    author: str | None = Field(None, description="Defaults to $USER at submit.")
    question: str | None = Field(
        None, min_length=1, description="What the experiment asks, in one sentence."
    )
    hypothesis: str | None = Field(
        None, min_length=1, description="The expected answer and why, in one sentence."
    )
    baseline: str | None = Field(
        None,
        description="The variant every other one is compared with (paired by task); "
        "one of the names under variants.",
    )
    decide: Decide | None = None
    harness_repo: str | None = Field(
        None,
        description="Harness registry directory (relative to the spec); default $HANGAR_HARNESS_REPO.",
    )
    environment: Environment = Field(default_factory=Environment)  # type: ignore[arg-type]
    tasks: Annotated[list[Task], Field(min_length=1)]
    variants: Annotated[dict[str, Variant], Field(min_length=1)]
    trials: int = Field(1, ge=1, le=MAX_TRIALS, description="Trials per variant and task.")
    parallel: int = Field(
        2, ge=1, le=MAX_PARALLEL, description="Most trials of this experiment in flight at once."
    )
    grader: Grader = Field(default_factory=Grader)  # type: ignore[arg-type]
    trial_job_budget: Budget | None = None
    budget: Budget | None = None
    reuse: Reuse | None = Field(
        None,
        description="Reuse of earlier experiments' trials; unset: on, at most "
        f"{DEFAULT_REUSE_MAX_AGE_DAYS:g} days old.",
    )
    nightly: Nightly | None = Field(
        None,
        description="Submit a fresh experiment of this spec every night once registered with "
        "`hangar experiment schedule SPEC`; `run` ignores it.",
    )

    @field_validator("author")
    @classmethod
    def _printable_author(cls, author: str | None) -> str | None:
        if author is not None and (bad := control_character(author)):
            raise PydanticCustomError(
                "control_character", f"the author {shown(author)} holds the control character {bad}"
            )
        return author


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


class RefusedForNow(SpecError):
    """A spec refused by the world as it is now, not by what it says: a base that did not
    resolve (a remote down, a branch not pushed yet) or a budget with too little left. The
    same submission may pass later (a nightly night is tried again within its catch-up)."""


_FIXES = {
    "missing": "add this field",
    "extra_forbidden": "remove it, or check its spelling against experiment.schema.json",
    "greater_than_equal": "use a larger number",
    "greater_than": "use a larger number",
    "less_than_equal": "use a smaller number (the bounds are in docs/operations.md)",
    "too_short": "give at least one entry",
    "string_too_short": "write at least one character, or leave the field out",
    "string_type": "write it as a string (quote it)",
    "int_type": "write a whole number, without quotes, a decimal point or an exponent",
    "int_parsing": "write a whole number",
    "float_type": "write a number",
    "finite_number": "write a finite number",
    "bool_type": "write true or false",
    "dict_type": "write it as a mapping (key: value)",
    "list_type": "write it as a list",
    "model_type": "write it as a mapping (key: value)",
    "literal_error": "use one of the allowed values",
    "control_character": "remove control and invisible characters (newlines, tabs, escapes, "
    "bidi and zero-width marks)",
    "nightly_at": AT_FIX,
    "time_zone": ZONE_FIX,
    "hidden_path": "name hidden files by relative, '/'-separated paths inside the hidden tests "
    "directory, without '..'",
}


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def structural_problems(err: ValidationError) -> list[Problem]:
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
    if bad := _bad_id(spec.name, "name"):
        problems.append(Problem(path="name", message=bad, fix=_ID_FIX))
    seen: set[str] = set()
    for i, task in enumerate(spec.tasks):
        if bad := _bad_id(task.id, "task id"):
            problems.append(Problem(path=f"tasks[{i}].id", message=bad, fix=_ID_FIX))
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
        if bad := _bad_id(name, "variant name"):
            problems.append(Problem(path=where, message=bad, fix=_ID_FIX))
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
    if spec.baseline is not None and spec.baseline not in spec.variants:
        problems.append(
            Problem(
                path="baseline",
                message=f"{shown(spec.baseline)} is not a variant of this spec",
                fix=f"name one of the variants: {', '.join(spec.variants)}",
            )
        )
    planned = spec.trials * sum(len(v.tasks or spec.tasks) for v in spec.variants.values())
    if planned > MAX_PLANNED_TRIALS:
        problems.append(
            Problem(
                path="trials",
                message=f"the spec plans {planned} trials (trials x tasks x variants), "
                f"over the limit of {MAX_PLANNED_TRIALS}",
                fix="run fewer trials, tasks or variants per experiment",
            )
        )
    return problems


_ID_FIX = "use letters, digits, _ and - (at most 48)"


def _bad_id(value: str, what: str) -> str | None:
    """Why ``value`` is not a valid id (the whole of it: `$` would let a trailing newline by)."""
    if _ID.fullmatch(value):
        return None
    if bad := control_character(value):
        return f"{shown(value)} is not a valid {what}: it holds the control character {bad}"
    return f"{shown(value)} is not a valid {what}"


def shown(value: str, limit: int = 80) -> str:
    """``value``'s repr, cut to ``limit`` characters: a refusal must not echo a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...' ({len(value)} characters)"


def require_mapping(data: Any, source: str, what: str, keys: str) -> None:
    """Refuse a YAML document that is not a mapping (a list, a string), naming its keys."""
    if not isinstance(data, dict):
        raise SpecError(
            source,
            [
                Problem(
                    path="(top level)",
                    message=f"the {what} is not a mapping",
                    fix=f"write the {what} as YAML keys: {keys}, ...",
                )
            ],
        )


def parse_spec(data: Any, source: str = "<spec>") -> ExperimentSpec:
    require_mapping(data, source, "spec", "name, tasks, variants")
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(source, structural_problems(err)) from None
    problems = semantic_problems(spec)
    if problems:
        raise SpecError(source, problems)
    return spec


def load_yaml_file(path: Path, what: str, limit: int = MAX_SPEC_BYTES) -> Any:
    """A bounded YAML file (a spec, a shadow policy) as data; every refusal a ``SpecError``."""
    try:
        text = read_text_bounded(path, limit, what)
    except InputFileError as err:
        raise SpecError(
            str(path),
            [
                Problem(
                    path="(file)",
                    message=str(err),
                    fix=f"check the path; a {what} is a UTF-8 YAML file of at most {limit} bytes",
                )
            ],
        ) from None
    try:
        return load_yaml(text)
    except YAMLRefusal as err:
        raise SpecError(
            str(path), [Problem(path=err.path, message=err.message, fix=err.fix)]
        ) from None
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


def load_spec(path: Path) -> ExperimentSpec:
    """Read (bounded, strict UTF-8), parse (duplicate keys, bombs, tags refused) and check."""
    return parse_spec(load_yaml_file(path, "spec"), str(path))


def json_schema() -> dict[str, Any]:
    schema = ExperimentSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hangar_dagster experiment spec"
    schema["x-input-bounds"] = {k: {"max": v, "unit": u} for k, (v, u) in INPUT_BOUNDS.items()}
    return schema
