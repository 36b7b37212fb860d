"""From a mainline's merges to shadow tasks: typed functions over a git repository.

A merged change is a commit on the mainline's first-parent chain (a merge commit, or the
single commit a squash or rebase merge leaves). Its task: base = its first parent; hidden
tests = the test files it changed, as merged; reference = its other changes as a patch;
instructions = its commit message. ``decide`` walks the new merges in order and keeps or
drops each with a reason; nothing here writes anything.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hangar_dagster.experiment.spec import MAX_HIDDEN_BYTES, MAX_HIDDEN_FILES, MAX_PATCH_BYTES
from hangar_dagster.shadow.policy import MergeDecision, ShadowPolicy, matches
from hangar_dagster.util.gitrepo import git

GIT_TIMEOUT_S = 120  # one git command over a local repository (a hung one ends the tick)

# Why a merge was dropped (docs/architecture.md, "Shadows"). The base check adds two more
# once the experiment ran: base_passes, reference_fails.
ROOT_COMMIT = "root_commit"
FILTERED = "filtered"
NO_TEST_CHANGES = "no_test_changes"
NOT_SAMPLED = "not_sampled"
OVER_CAP = "over_cap"
NO_CODE_CHANGES = "no_code_changes"
UNREADABLE_TESTS = "unreadable_tests"
TOO_LARGE = "too_large"
UNREADABLE_MERGE = "unreadable_merge"  # git failed on it: dropped alone, the others go on
# Paths per `git diff` call: a merge touching many files must not overflow the argument list.
PATHS_PER_DIFF = 500


@dataclass(frozen=True)
class Change:
    status: str  # git's letter: A, M, D, T
    path: str


@dataclass(frozen=True)
class Merge:
    sha: str
    parent: str | None  # the first parent; None for a root commit
    message: str
    changes: tuple[Change, ...]  # against the first parent

    @property
    def subject(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


@dataclass(frozen=True)
class ShadowTask:
    id: str
    merge: str
    base: str
    instructions: str
    hidden_tests: dict[str, str]
    reference_patch: str


def task_id(sha: str) -> str:
    return f"m-{sha[:12]}"


def merge_shas(repo: Path, tip: str, cursor: str | None) -> list[str]:
    """The first-parent commits after ``cursor`` up to ``tip``, oldest first."""
    span = f"{cursor}..{tip}" if cursor else tip
    return git(
        "rev-list", "--first-parent", "--reverse", span, cwd=repo, timeout=GIT_TIMEOUT_S
    ).split()


def new_merges(repo: Path, tip: str, cursor: str | None) -> list[Merge]:
    return [read_merge(repo, sha) for sha in merge_shas(repo, tip, cursor)]


def read_merge(repo: Path, sha: str) -> Merge:
    parents = git("rev-list", "--parents", "-n", "1", sha, cwd=repo, timeout=GIT_TIMEOUT_S).split()[
        1:
    ]
    message = git("log", "-1", "--format=%B", sha, cwd=repo, timeout=GIT_TIMEOUT_S)
    if not parents:
        return Merge(sha, None, message, ())
    # --no-renames: a renamed file is a delete and an add, so its new content is read whole.
    out = git(
        "diff",
        "--name-status",
        "--no-renames",
        "-z",
        parents[0],
        sha,
        cwd=repo,
        timeout=GIT_TIMEOUT_S,
    )
    fields = out.split("\0")
    changes = tuple(
        Change(fields[i][0], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]
    )
    return Merge(sha, parents[0], message, changes)


def sampled(sha: str, rate: float) -> bool:
    """Whether a merge is in the sample: a hash of its SHA against the rate, so every tick
    (and every policy at that rate) picks the same merges."""
    return int(hashlib.sha256(sha.encode()).hexdigest()[:16], 16) / 2**64 < rate


def split(merge: Merge, policy: ShadowPolicy) -> tuple[list[Change], list[Change]]:
    """The merge's (test, other) changes, excluded paths left out."""
    tests: list[Change] = []
    other: list[Change] = []
    for c in merge.changes:
        if matches(c.path, policy.paths.exclude):
            continue
        (tests if matches(c.path, policy.paths.tests) else other).append(c)
    return tests, other


def screen(merge: Merge, policy: ShadowPolicy) -> tuple[str, str] | None:
    """Why the merge is dropped before any task is built (reason, detail), or None."""
    if merge.parent is None:
        return ROOT_COMMIT, "the repository's first commit has no base to start from"
    if policy.paths.include and not any(
        matches(c.path, policy.paths.include) for c in merge.changes
    ):
        return FILTERED, "it changes no file paths.include names"
    tests, other = split(merge, policy)
    if not tests and not other:
        return FILTERED, "every file it changes is in paths.exclude"
    if not [c for c in tests if c.status != "D"]:
        return NO_TEST_CHANGES, "it adds or changes no test file (paths.tests)"
    if not sampled(merge.sha, policy.sample_rate):
        return NOT_SAMPLED, f"not in the {policy.sample_rate:g} sample (a hash of its SHA)"
    return None


def build_task(repo: Path, merge: Merge, policy: ShadowPolicy) -> ShadowTask | tuple[str, str]:
    """The merge's task, or why none can be built (reason, detail)."""
    assert merge.parent is not None, "screen() drops root commits"
    tests, other = split(merge, policy)
    kept = [c.path for c in tests if c.status != "D"]
    if len(kept) > MAX_HIDDEN_FILES:
        return TOO_LARGE, f"{len(kept)} test files, over {MAX_HIDDEN_FILES}"
    hidden: dict[str, str] = {}
    for path in kept:
        try:
            raw = git_bytes(repo, f"{merge.sha}:{path}")
        except subprocess.CalledProcessError as err:
            why = err.stderr.decode(errors="replace").strip()
            return UNREADABLE_TESTS, f"{path} is not a file git can read (a submodule?): {why}"
        try:
            hidden[path] = raw.decode()
        except UnicodeDecodeError:
            return UNREADABLE_TESTS, f"{path} is not UTF-8 text"
    if sum(len(t.encode()) for t in hidden.values()) > MAX_HIDDEN_BYTES:
        return TOO_LARGE, f"its test files hold over {MAX_HIDDEN_BYTES} bytes"
    if not other:
        return NO_CODE_CHANGES, "it changes tests only: no reference to check them against"
    paths = [c.path for c in other]
    patch = "".join(
        git(
            "--literal-pathspecs",  # file names, not globs: `w*.py`, `:odd.py`, `[x].py`
            "diff",
            "--binary",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",  # git's bytes, not a filter's view (nor its command run)
            "--no-renames",
            merge.parent,
            merge.sha,
            "--",
            *paths[i : i + PATHS_PER_DIFF],  # sorted as git lists them: the patch reads in order
            cwd=repo,
            timeout=GIT_TIMEOUT_S,
        )
        for i in range(0, len(paths), PATHS_PER_DIFF)
    )
    if len(patch.encode()) > MAX_PATCH_BYTES:
        return TOO_LARGE, f"its reference patch is over {MAX_PATCH_BYTES} bytes"
    return ShadowTask(
        id=task_id(merge.sha),
        merge=merge.sha,
        base=merge.parent,
        instructions=merge.message.strip() or merge.subject or f"Make the change {merge.sha}.",
        hidden_tests=hidden,
        reference_patch=patch,
    )


def git_bytes(repo: Path, spec: str) -> bytes:
    """A blob's bytes (``git`` decodes text; a test file may not be UTF-8)."""
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "cat-file", "blob", spec],
        cwd=repo,
        capture_output=True,
        check=True,
        timeout=GIT_TIMEOUT_S,
    ).stdout


def decide(
    repo: Path,
    merges: list[Merge],
    policy: ShadowPolicy,
    kept_tonight: int,
    night: str,
    now: dt.datetime,
) -> tuple[list[MergeDecision], list[ShadowTask]]:
    """Each merge kept (with its task) or dropped with its reason, in mainline order; at most
    ``policy.max_per_night`` kept in a night, ``kept_tonight`` of which were kept before."""
    decisions: list[MergeDecision] = []
    tasks: list[ShadowTask] = []
    for merge in merges:
        tests, _ = split(merge, policy)
        said = screen(merge, policy)
        if said is None and kept_tonight + len(tasks) >= policy.max_per_night:
            said = OVER_CAP, f"{policy.max_per_night} merges were already kept for night {night}"
        built = None
        if said is None:
            try:
                result = build_task(repo, merge, policy)
            except Exception as err:  # one merge git cannot read stops no other (why: recorded)
                result = UNREADABLE_MERGE, f"{type(err).__name__}: {err}"[:2000]
            if isinstance(result, ShadowTask):
                built = result
            else:
                said = result
        if built is not None:
            tasks.append(built)
        decisions.append(
            MergeDecision(
                sha=merge.sha,
                subject=merge.subject[:200],
                seen_at=now,
                night=night,
                kept=built is not None,
                reason=said[0] if said else None,
                detail=said[1] if said else None,
                task=built.id if built else None,
                test_files=[c.path for c in tests if c.status != "D"],
            )
        )
    return decisions, tasks
