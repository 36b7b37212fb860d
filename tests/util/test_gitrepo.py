"""Git plumbing on real repositories: base resolution, isolated clones, patches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hangar_dagster.util.gitrepo import (
    GitError,
    apply_patch,
    cached_clone,
    changed_files,
    git,
    isolated_clone,
    repo_location,
    resolve_base,
    take_patch,
)
from tests.gitfixtures import Upstream

pytestmark = pytest.mark.unit


@pytest.fixture
def up(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


def all_objects(repo: Path) -> set[str]:
    out = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=repo)
    return set(out.split())


def test_repo_location(tmp_path: Path) -> None:
    assert repo_location("https://example.com/r.git", tmp_path) == "https://example.com/r.git"
    assert repo_location("git@example.com:r.git", tmp_path) == "git@example.com:r.git"
    assert repo_location("repos/r", tmp_path) == str(tmp_path / "repos" / "r")


def test_resolve_base(up: Upstream) -> None:
    repo = str(up.path)
    assert resolve_base(repo, "main") == up.later
    assert resolve_base(repo, "v1") == up.base
    assert resolve_base(repo, "v2") == up.later  # an annotated tag resolves to its commit
    assert resolve_base(repo, up.base[:10]) == up.base
    with pytest.raises(GitError, match="no commit, tag or branch named 'nope'"):
        resolve_base(repo, "nope")


def test_resolve_base_over_a_url(up: Upstream) -> None:
    url = f"file://{up.path}"
    assert resolve_base(url, "main") == up.later
    assert resolve_base(url, "v2") == up.later  # the peeled tag, not the tag object
    assert resolve_base(url, up.base) == up.base


def test_isolated_clone_holds_only_the_base_history(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    assert git("rev-parse", "HEAD", cwd=dest).strip() == up.base
    assert (dest / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert git("status", "--porcelain", cwd=dest) == ""
    assert git("remote", cwd=dest) == ""
    assert git("tag", cwd=dest) == ""
    assert git("for-each-ref", "--format=%(refname)", cwd=dest).split() == [
        "refs/heads/hangar-base"
    ]
    assert not (dest / ".git" / "FETCH_HEAD").exists()
    # Every object in the clone is reachable from the base; the later ones are not there.
    reachable = set(git("rev-list", "--objects", up.base, cwd=up.path).split()) - {
        "calc.py",
        "old.txt",
    }
    assert all_objects(dest) == reachable
    for sha in (up.later, up.answer_commit, up.answer_blob):
        with pytest.raises(GitError):
            git("cat-file", "-e", sha, cwd=dest)


def test_isolated_clone_shares_nothing_with_the_source(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    assert not (dest / ".git" / "objects" / "info" / "alternates").exists()
    for f in (dest / ".git" / "objects").rglob("*"):
        if f.is_file():
            assert f.stat().st_nlink == 1, f  # not hardlinked into the source's store
    shutil.rmtree(up.path)
    assert git("log", "--format=%H", cwd=dest).split() == [up.base]
    assert git("fsck", "--full", cwd=dest) == ""


def test_isolated_clone_refuses_an_unknown_commit_and_an_existing_dest(
    up: Upstream, tmp_path: Path
) -> None:
    with pytest.raises(GitError):
        isolated_clone(str(up.path), "0" * 40, tmp_path / "c1")
    (tmp_path / "c2").mkdir()
    with pytest.raises(FileExistsError):
        isolated_clone(str(up.path), up.base, tmp_path / "c2")


def test_cached_clone_is_the_isolated_clone_copied_from_a_pristine_one(
    up: Upstream, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first, second, plain = tmp_path / "c1", tmp_path / "c2", tmp_path / "plain"
    assert cached_clone(str(up.path), up.base, first, cache) == ["calc.py", "old.txt"]
    isolated_clone(str(up.path), up.base, plain)
    # The same repository as a fresh isolated clone: base only, no remote, no later object.
    assert git("rev-parse", "HEAD", cwd=first).strip() == up.base
    assert git("status", "--porcelain", cwd=first) == ""
    assert git("remote", cwd=first) == ""
    assert all_objects(first) == all_objects(plain)
    for sha in (up.later, up.answer_commit, up.answer_blob):
        with pytest.raises(GitError):
            git("cat-file", "-e", sha, cwd=first)
    # Made once: the second copy comes from the same cache entry, the source is not read.
    (entry,) = [p for p in cache.iterdir()]
    shutil.rmtree(up.path)
    assert cached_clone(str(up.path), up.base, second, cache) == ["calc.py", "old.txt"]
    assert [p for p in cache.iterdir()] == [entry]
    # Real copies: what a grade's code does to its copy never reaches the cache or another copy.
    for f in second.rglob("*"):
        if f.is_file():
            assert f.stat().st_nlink == 1, f
    (second / "calc.py").write_text("tampered\n")
    (second / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
    third = tmp_path / "c3"
    cached_clone(str(up.path), up.base, third, cache)
    assert (third / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert "fsmonitor" not in (third / ".git" / "config").read_text()
    assert (first / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"


def test_cached_clone_refuses_an_existing_dest_and_keeps_no_half_entry(
    up: Upstream, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "there").mkdir()
    with pytest.raises(FileExistsError):
        cached_clone(str(up.path), up.base, tmp_path / "there", cache)
    with pytest.raises(GitError):
        cached_clone(str(up.path), "0" * 40, tmp_path / "c1", cache)
    assert list(cache.iterdir()) == []  # the failed clone left nothing to be copied later


def test_take_patch_covers_edits_new_deleted_and_binary_files(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    (dest / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (dest / "new.py").write_text("x = 1\n")
    (dest / "old.txt").unlink()
    (dest / "blob.bin").write_bytes(bytes(range(256)))
    patch = take_patch(dest, up.base)
    assert changed_files(patch) == ["blob.bin", "calc.py", "new.py", "old.txt"]
    assert "GIT binary patch" in patch
    # The patch reproduces the tree on a fresh clone of the base.
    other = tmp_path / "other"
    isolated_clone(str(up.path), up.base, other)
    apply_patch(other, patch)
    assert take_patch(other, up.base) == patch
    assert (other / "blob.bin").read_bytes() == bytes(range(256))


def test_take_patch_counts_committed_work(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    (dest / "calc.py").write_text("changed\n")
    git("commit", "-q", "-am", "agent commit", cwd=dest)
    assert changed_files(take_patch(dest, up.base)) == ["calc.py"]


def test_take_patch_with_a_saved_git_dir_ignores_the_worktree_config(
    up: Upstream, tmp_path: Path
) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    saved = tmp_path / "saved-git"
    shutil.copytree(dest / ".git", saved, symlinks=True)
    pwned = tmp_path / "pwned"
    git("config", "core.fsmonitor", f"touch {pwned}; false", cwd=dest)
    (dest / "calc.py").write_text("changed\n")
    patch = take_patch(dest, up.base, git_dir=saved)
    assert changed_files(patch) == ["calc.py"]
    assert not pwned.exists()
    take_patch(dest, up.base)  # the control: without the saved git dir, the config runs
    assert pwned.exists()


def test_changed_files_lists_both_sides_of_a_rename(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    (dest / "old.txt").rename(dest / "renamed.txt")
    patch = take_patch(dest, up.base)
    assert "rename from old.txt" in patch
    assert changed_files(patch) == ["old.txt", "renamed.txt"]


def test_apply_patch(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    apply_patch(dest, "")  # nothing to apply
    assert git("status", "--porcelain", cwd=dest) == ""
    with pytest.raises(GitError, match="git apply"):
        apply_patch(
            dest,
            "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n",
        )


def test_isolated_clone_over_a_url_fetches_a_commit_that_is_no_ref_tip(
    up: Upstream, tmp_path: Path
) -> None:
    git("tag", "-d", "v1", cwd=up.path)
    dest = tmp_path / "clone"
    isolated_clone(f"file://{up.path}", up.base, dest)
    assert git("log", "--all", "--format=%H", cwd=dest).split() == [up.base]
    assert git("remote", cwd=dest) == ""


def test_a_git_command_past_its_timeout_is_stopped_with_a_git_error() -> None:
    from hangar_dagster.util.gitrepo import GitError, git

    with pytest.raises(GitError, match="ran past 1 s"):
        # A transport that hangs (a remote that never answers), allowed for this call only.
        git("-c", "protocol.ext.allow=always", "ls-remote", "ext::sleep 30", timeout=1)


def test_resolve_base_over_a_remote_that_never_answers_stops_at_its_time_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A nightly or shadow tick resolving a branch must not wait forever on a stalled remote:
    resolve_base has a time limit even when the caller gives none."""
    from hangar_dagster.util import gitrepo

    monkeypatch.setattr(gitrepo, "REMOTE_TIMEOUT_S", 1)
    monkeypatch.setenv("GIT_SSH_COMMAND", "sleep 30;:")  # an ssh transport that never answers
    with pytest.raises(gitrepo.GitError, match="ran past 1 s"):
        gitrepo.resolve_base("ssh://hangar-test.invalid/repo.git", "main")


def test_a_patch_keeps_crlf_line_ends(up: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    isolated_clone(str(up.path), up.base, dest)
    (dest / "win.txt").write_bytes(b"one\r\ntwo\r\n")
    patch = take_patch(dest, up.base)
    assert "+one\r\n+two\r\n" in patch
    other = tmp_path / "other"
    isolated_clone(str(up.path), up.base, other)
    apply_patch(other, patch)
    assert (other / "win.txt").read_bytes() == b"one\r\ntwo\r\n"


def test_a_clone_from_a_remote_that_never_answers_stops_at_its_time_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A trial's clone (and a grade's, a build's) fetching from a stalled remote would hold its
    slot forever: the fetch has a time limit (then GitError, which a trial reports as an
    infra error, clone)."""
    from hangar_dagster.util import gitrepo

    monkeypatch.setattr(gitrepo, "FETCH_TIMEOUT_S", 1)
    # An ssh transport that never answers, its sleep named so this test finds it.
    monkeypatch.setenv("GIT_SSH_COMMAND", "sleep 29.25;:")
    with pytest.raises(gitrepo.GitError, match="ran past 1 s"):
        gitrepo.isolated_clone("ssh://hangar-test.invalid/repo.git", "a" * 40, tmp_path / "c")
    with pytest.raises(gitrepo.GitError, match="ran past 1 s"):
        gitrepo.cached_clone(
            "ssh://hangar-test.invalid/repo.git", "a" * 40, tmp_path / "d", tmp_path / "cache"
        )
    # Stopped with git: the transport it started (killing git alone left it running).
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"29.25" in _read_or_empty(p)]
    assert left == []


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while the list was read
        return b""
