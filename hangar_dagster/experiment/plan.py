"""The resolved experiment: a spec with every reference pinned, as stored at submit.

``submit.resolve`` turns an ``ExperimentSpec`` into a ``ResolvedExperiment``:
base refs become full SHAs, harness locks are verified, hidden tests and
reference patches are read in, the canary is set, and each variant gets its
pin set. Everything downstream (assets, trials, grader) reads this, never the
YAML again, so an edit to the spec file after submit changes nothing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from hangar_dagster.experiment.spec import Environment, ExperimentSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResolvedTask(_Frozen):
    id: str
    instructions: str
    repo: str  # git URL or absolute path
    base_sha: str
    verify: str | None
    reference_patch: str | None
    hidden_files: dict[str, str]  # relative path -> content, without the canary line
    build: tuple[str, ...] = ()  # the task's own build steps, after environment.build


class ResolvedVariant(_Frozen):
    name: str
    harness_lock: str  # name@sha256:<digest>
    harness_digest: str
    harness_path: str  # the lock directory in the registry
    adapter: str
    model: str  # the concrete id every trial runs (a policy is resolved once, at submit)
    environment: Environment
    environment_digest: str
    tasks: tuple[str, ...]
    pin_set: str
    model_requested: str | None = None  # as the lock wrote it: an id or a policy (balanced, ...)
    model_concrete_basis: str | None = None  # list | pattern (model_policy.py); None: an alias
    model_note: str | None = None  # why the basis is pattern (also an experiment note)
    # A deprecated overlay variant: its harness was built at submit (overlay.py) and its
    # pin set is recorded by its first finished trial.
    overlay: bool = False


class ReuseSource(_Frozen):
    """The stored trial a key of this experiment is a copy of (experiment/reuse.py)."""

    experiment_id: str
    trial_key: str
    attempt: int
    # The measurement it is: the source's own ``reused_from`` when the source was reused
    # itself, so a chain of nights always names the run that measured it, and its time.
    original: dict[str, str | int]


class ReusePlan(_Frozen):
    """What submit decided to reuse: trial key -> its source; and what it kept fresh."""

    enabled: bool = True
    max_age_days: float = 0.0
    sources: dict[str, ReuseSource] = {}
    health: dict[str, str] = {}  # variant -> the planned key run fresh as its health check
    notes: tuple[str, ...] = ()  # per variant, what was reused and why the rest was not
    # A regrade (experiment/regrade.py) copies the trials without their grades, and each new
    # grade names the one it replaces: trial key -> {experiment_id, trial_key, attempt,
    # grader_digest}.
    copy_grades: bool = True
    regrade_of: dict[str, dict[str, str | int]] = {}


class ShadowOrigin(_Frozen):
    """Where a shadow experiment's tasks came from (shadow/): each task is one merge."""

    policy: str
    repo: str
    mainline: str
    tip: str  # the mainline commit the sensor's tick looked up to
    merges: dict[str, str]  # task id -> the merge's SHA (a trial's shadow_of)


class ResolvedExperiment(_Frozen):
    experiment_id: str
    name: str
    author: str
    spec_path: str
    submitted_at: dt.datetime
    spec: ExperimentSpec  # as written, with grader.canary filled in
    tasks: dict[str, ResolvedTask]
    variants: dict[str, ResolvedVariant]
    grader_digest: str
    reuse: ReusePlan | None = None  # None: decided before reuse existed, or nothing to decide
    regrade_of: str | None = None  # the experiment whose stored patches this one grades again
    shadow: ShadowOrigin | None = None  # a shadow's experiment: its trials are source shadow

    @property
    def canary(self) -> str:
        assert self.spec.grader.canary is not None
        return self.spec.grader.canary

    def trial_keys(self) -> list[TrialKey]:
        return [
            TrialKey(v.name, task, rep)
            for v in self.variants.values()
            for task in v.tasks
            for rep in range(1, self.spec.trials + 1)
        ]


@dataclass(frozen=True, order=True)
class TrialKey:
    variant: str
    task: str
    replicate: int

    @property
    def key(self) -> str:
        return f"{self.variant}/{self.task}/{self.replicate}"

    @property
    def task_rep(self) -> str:
        """The trial's value in the ``task_rep`` partition dimension."""
        return f"{self.task}.r{self.replicate}"

    @classmethod
    def parse(cls, key: str) -> TrialKey:
        variant, task, rep = key.split("/")
        return cls(variant, task, int(rep))

    @classmethod
    def from_partition(cls, variant: str, task_rep: str) -> TrialKey:
        task, _, rep = task_rep.rpartition(".r")
        return cls(variant, task, int(rep))
