"""From merges to shadow tasks, over real git repositories built here."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.shadow.merges import (
    FILTERED,
    NO_CODE_CHANGES,
    NO_TEST_CHANGES,
    NOT_SAMPLED,
    OVER_CAP,
    ROOT_COMMIT,
    ShadowTask,
    build_task,
    decide,
    new_merges,
    read_merge,
    sampled,
    task_id,
)
from hangar_dagster.shadow.policy import ShadowPolicy, parse_policy
from hangar_dagster.util.gitrepo import apply_patch, git, isolated_clone
from tests.shadowfixtures import Mainline, hidden_test

pytestmark = pytest.mark.unit

LOCK = "cand@sha256:" + "a" * 64
NOW = dt.datetime(2026, 12, 3, 1, 0, tzinfo=dt.UTC)


def policy(**kw: Any) -> ShadowPolicy:
    data: dict[str, Any] = {
        "name": "calc",
        "repo": "/nowhere",
        "harness_lock": LOCK,
        "sample_rate": 1.0,
        "max_per_night": 10,
    }
    return parse_policy(data | kw)


def unit(sha: str) -> float:
    return int(hashlib.sha256(sha.encode()).hexdigest()[:16], 16) / 2**64


@pytest.fixture
def repo(tmp_path: Path) -> Mainline:
    return Mainline(tmp_path)


def test_a_merge_commit_becomes_a_task_at_its_first_parent(repo: Mainline, tmp_path: Path) -> None:
    before = repo.head()
    sha = repo.merge(
        "Fix add: it subtracted\n\nadd(2, 3) gave -1.",
        {
            "calc.py": repo.calc("return a - b", "return a + b"),
            "tests/test_add.py": hidden_test("add", "assert add(2, 3) == 5"),
        },
    )
    [merge] = new_merges(repo.path, sha, before)
    assert merge.sha == sha and merge.parent == before  # first parent: main before the merge
    task = build_task(repo.path, merge, policy())
    assert isinstance(task, ShadowTask)
    assert task.id == task_id(sha) == f"m-{sha[:12]}"
    assert task.base == before
    assert task.hidden_tests == {"tests/test_add.py": hidden_test("add", "assert add(2, 3) == 5")}
    assert task.instructions == "Fix add: it subtracted\n\nadd(2, 3) gave -1."
    # The reference is the merge's non-test change: applied to the base, it is the merged code.
    assert "tests/" not in task.reference_patch and "calc.py" in task.reference_patch
    clone = tmp_path / "clone"
    isolated_clone(str(repo.path), before, clone)
    apply_patch(clone, task.reference_patch)
    assert (clone / "calc.py").read_text() == (repo.path / "calc.py").read_text()
    assert not (clone / "tests" / "test_add.py").exists()


def test_new_merges_follow_the_first_parent_chain_oldest_first(repo: Mainline) -> None:
    start = repo.head()
    one = repo.merge("one", {"README.md": "one\n"})
    two = repo.squash("two", {"README.md": "two\n"})
    merges = new_merges(repo.path, two, start)
    # The feature branch's own commit is not a merged change of its own.
    assert [m.sha for m in merges] == [one, two]
    assert new_merges(repo.path, two, two) == []


def test_each_drop_says_why(repo: Mainline) -> None:
    start = repo.head()
    docs = repo.merge("docs", {"README.md": "more\n"})
    tests_only = repo.merge(
        "tests only", {"tests/test_neg.py": hidden_test("neg", "assert neg(1) == -1")}
    )
    excluded = repo.merge("vendored", {"vendor/x.py": "x = 1\n"})
    fix = repo.merge(
        "fix sub",
        {
            "calc.py": repo.calc("return a + b", "return a - b"),
            "tests/test_sub.py": hidden_test("sub", "assert sub(3, 1) == 2"),
        },
    )
    merges = new_merges(repo.path, fix, start)
    decisions, tasks = decide(
        repo.path, merges, policy(paths={"exclude": ["vendor/**"]}), 0, "2026-12-02", NOW
    )
    said = {d.sha: (d.kept, d.reason) for d in decisions}
    assert said == {
        docs: (False, NO_TEST_CHANGES),
        tests_only: (False, NO_CODE_CHANGES),
        excluded: (False, FILTERED),
        fix: (True, None),
    }
    assert [t.merge for t in tasks] == [fix]
    assert all(d.detail for d in decisions if not d.kept)
    assert next(d for d in decisions if d.kept).task == task_id(fix)


def test_include_filters_merges_that_touch_none_of_its_paths(repo: Mainline) -> None:
    start = repo.head()
    sha = repo.fix_add()
    merges = new_merges(repo.path, sha, start)
    [kept], _ = decide(repo.path, merges, policy(paths={"include": ["*.py"]}), 0, "n", NOW)
    [dropped], _ = decide(repo.path, merges, policy(paths={"include": ["src/**"]}), 0, "n", NOW)
    assert kept.kept and (dropped.kept, dropped.reason) == (False, FILTERED)


def test_sampling_is_a_hash_of_the_sha_against_the_rate(repo: Mainline) -> None:
    start = repo.head()
    sha = repo.fix_add()
    merges = new_merges(repo.path, sha, start)
    u = unit(sha)
    [out], _ = decide(repo.path, merges, policy(sample_rate=u), 0, "n", NOW)
    [inn], _ = decide(repo.path, merges, policy(sample_rate=min(1.0, u + 1e-9)), 0, "n", NOW)
    assert (out.kept, out.reason) == (False, NOT_SAMPLED) and inn.kept
    # Deterministic, and near the rate over many SHAs.
    shas = [hashlib.sha1(str(i).encode()).hexdigest() for i in range(4000)]
    assert [sampled(s, 0.25) for s in shas] == [sampled(s, 0.25) for s in shas]
    assert 0.22 < sum(sampled(s, 0.25) for s in shas) / len(shas) < 0.28
    assert all(sampled(s, 1.0) for s in shas)


def test_the_nightly_cap_counts_merges_kept_earlier_that_night(repo: Mainline) -> None:
    start = repo.head()
    a = repo.fix_add()
    b = repo.fix_sub()
    merges = new_merges(repo.path, b, start)
    decisions, tasks = decide(repo.path, merges, policy(max_per_night=3), 2, "2026-12-02", NOW)
    assert [(d.sha, d.kept, d.reason) for d in decisions] == [
        (a, True, None),
        (b, False, OVER_CAP),
    ]
    assert len(tasks) == 1 and "2026-12-02" in (decisions[1].detail or "")


def test_the_first_commit_has_no_base(repo: Mainline) -> None:
    root = git("rev-list", "--max-parents=0", "HEAD", cwd=repo.path).strip()
    [d], tasks = decide(repo.path, [read_merge(repo.path, root)], policy(), 0, "n", NOW)
    assert (d.kept, d.reason, tasks) == (False, ROOT_COMMIT, [])


def test_a_deleted_test_file_is_no_hidden_test(repo: Mainline) -> None:
    start = repo.head()
    repo.squash("add a test", {"tests/test_neg.py": hidden_test("neg", "assert neg(1) == -1")})
    mid = repo.head()
    sha = repo.squash(
        "drop it, fix add",
        {"tests/test_neg.py": None, "calc.py": repo.calc("return a - b", "return a + b")},
    )
    merges = new_merges(repo.path, sha, mid)
    [d], _ = decide(repo.path, merges, policy(), 0, "n", NOW)
    assert (d.kept, d.reason) == (False, NO_TEST_CHANGES)
    assert start != mid


def test_file_names_are_paths_not_globs_and_the_patch_ignores_textconv(repo: Mainline) -> None:
    before = repo.head()
    # The repository's own attributes ask for a textconv filter on .py files; the patch must
    # be git's bytes, not the filter's view (nor a command the repository names being run).
    git("config", "diff.upper.textconv", "tr a-z A-Z", cwd=repo.path)
    sha = repo.merge(
        "Odd names",
        {
            ".gitattributes": "*.py diff=upper\n",
            "w*.py": "wild = 1\n",  # a glob, taken literally: it must not pull in wide.py
            "wide.py": "left = 'out'\n",  # paths.exclude
            ":odd.py": "odd = 1\n",  # a leading ':' is pathspec magic unless literal
            "tests/test_w.py": hidden_test("w", "assert True"),
        },
    )
    [merge] = new_merges(repo.path, sha, before)
    task = build_task(repo.path, merge, policy(paths={"exclude": ["wide.py"]}))
    assert isinstance(task, ShadowTask), task
    files = [line for line in task.reference_patch.splitlines() if line.startswith("diff --git")]
    assert files == [
        "diff --git a/.gitattributes b/.gitattributes",
        "diff --git a/:odd.py b/:odd.py",
        "diff --git a/w*.py b/w*.py",
    ]
    assert "+wild = 1" in task.reference_patch and "WILD" not in task.reference_patch
