"""Git plumbing for tasks: resolve a base, clone only up to it, apply and take patches.

A trial's clone must hold the base's history and nothing else: no remote, no
later branch, tag or object the agent could read an answer from. So the
clone is built by fetching exactly the base commit into an empty repository,
not by ``git clone`` (which copies every ref and, for local paths, hardlinks
the whole object store).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

_SHA = re.compile(r"^[0-9a-f]{40}$")
# Fixed identity and dates so repositories and patches are reproducible.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "hangar",
    "GIT_AUTHOR_EMAIL": "hangar@localhost",
    "GIT_COMMITTER_NAME": "hangar",
    "GIT_COMMITTER_EMAIL": "hangar@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


class GitError(RuntimeError):
    pass


def git(
    *args: str, cwd: Path | None = None, input: str | None = None, timeout: float | None = None
) -> str:
    """Run git; GitError when it fails or runs past ``timeout`` seconds (then it is killed)."""
    env = {**os.environ, **GIT_ENV, "HOME": os.environ.get("HOME", "/root")}
    # Bytes, decoded here: text=True would turn a file's CRLF into LF in a patch. Its own
    # session, so that a timeout stops the transport git started too (ssh, git-remote-https),
    # not git alone.
    with subprocess.Popen(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(None if input is None else input.encode(), timeout=timeout)
        except BaseException as stopped:  # the timeout, or Ctrl-C: git and its transport end
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if isinstance(stopped, subprocess.TimeoutExpired):
                raise GitError(
                    f"git {' '.join(args)} ran past {timeout:g} s and was stopped"
                ) from None
            raise
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip()
        raise GitError(
            f"git {' '.join(args)} failed: {said or out.decode(errors='replace').strip()}"
        )
    return out.decode()


def repo_location(repo: str, relative_to: Path) -> str:
    """A spec's ``repo``: URLs stay as they are; paths become absolute (relative to the spec)."""
    if "://" in repo or repo.startswith("git@"):
        return repo
    return str((relative_to / repo).resolve())


# How long asking a remote for a ref may take when the caller names no limit: a stalled remote
# would otherwise hold a submit, or a nightly or shadow tick and its lock, forever.
REMOTE_TIMEOUT_S = 120.0


def resolve_base(repo: str, ref: str, timeout: float | None = None) -> str:
    """The full SHA ``ref`` names in ``repo`` (a commit, tag or branch); GitError past
    ``timeout`` seconds (``REMOTE_TIMEOUT_S`` when None)."""
    timeout = REMOTE_TIMEOUT_S if timeout is None else timeout
    if Path(repo).exists():
        try:
            return git(
                "rev-parse",
                "--verify",
                "--quiet",
                f"{ref}^{{commit}}",
                cwd=Path(repo),
                timeout=timeout,
            ).strip()
        except GitError:
            raise GitError(f"{repo}: no commit, tag or branch named {ref!r}") from None
    if _SHA.match(ref):
        return ref  # a remote can't be asked about a bare SHA; fetching it at clone time checks it
    found: dict[str, str] = {}
    for line in git("ls-remote", repo, ref, f"refs/tags/{ref}^{{}}", timeout=timeout).splitlines():
        sha, _, name = line.partition("\t")
        if _SHA.match(sha):
            found.setdefault("peeled" if name.endswith("^{}") else "ref", sha)
    # An annotated tag is listed twice: the tag object, then (peeled, ^{}) its commit.
    if found:
        return found.get("peeled", found["ref"])
    raise GitError(f"{repo}: no commit, tag or branch named {ref!r}")


# How long fetching a base may take: a real project's history over a slow link takes minutes,
# a stalled remote would hold a trial's slot (or a grade's, a build's) forever.
FETCH_TIMEOUT_S = 900.0


def isolated_clone(repo: str, sha: str, dest: Path) -> None:
    """Make ``dest`` a repository holding ``sha`` and its history only, checked out, with no
    remote; GitError if the fetch runs past ``FETCH_TIMEOUT_S``."""
    dest.mkdir(parents=True, exist_ok=False)
    git("init", "-q", "-b", "hangar-base", str(dest))
    # Fetching by SHA transfers that commit's closure only; no refs come along.
    git(
        "-c",
        "uploadpack.allowAnySHA1InWant=true",
        "fetch",
        "-q",
        "--no-tags",
        repo,
        sha,
        cwd=dest,
        timeout=FETCH_TIMEOUT_S,
    )
    git("reset", "-q", "--hard", sha, cwd=dest)
    (dest / ".git" / "FETCH_HEAD").unlink(missing_ok=True)
    git("reflog", "expire", "--expire=now", "--all", cwd=dest)
    git("gc", "-q", "--prune=now", cwd=dest)


def cached_clone(repo: str, sha: str, dest: Path, cache: Path) -> list[str]:
    """``isolated_clone`` of ``repo`` at ``sha`` into ``dest``, copied from a pristine clone kept
    under ``cache``; returns the paths the base commit tracks (``git ls-files``).

    The pristine clone is made once per (repo, sha), by ``isolated_clone`` into a temporary
    directory renamed into place (complete or absent; a concurrent maker that loses the rename
    uses the winner's). Each call copies it with ``cp -a`` (one process instead of seven
    ``git`` runs): real copies, never hard links, since ``dest`` is handed to untrusted code
    and its inodes must not be the cache's. ``cache`` must be a directory no sandbox mounts.
    """
    if os.path.lexists(dest):
        raise FileExistsError(f"{dest} exists; a clone goes into a new directory")
    key = hashlib.sha256(f"{repo}\0{sha}".encode()).hexdigest()[:32]
    entry = cache / key
    if not (entry / "files").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
        try:
            isolated_clone(repo, sha, tmp / "tree")
            listing = git("ls-files", "-z", cwd=tmp / "tree")
            # Written last: its presence marks a complete entry.
            (tmp / "files").write_text(listing, encoding="utf-8")
            try:
                os.rename(tmp, entry)
            except OSError:
                if not (entry / "files").is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", str(entry / "tree"), str(dest)],
        capture_output=True,
    )
    if proc.returncode != 0:
        raise GitError(f"copying the clone of {sha} into {dest} failed: {proc.stderr.decode(errors='replace').strip()}")  # fmt: skip
    return [p for p in (entry / "files").read_text(encoding="utf-8").split("\0") if p]


def take_patch(workdir: Path, base_sha: str, git_dir: Path | None = None) -> str:
    """What the working tree changed against ``base_sha`` (a commit or tree), new files included.

    After untrusted code ran in ``workdir``, pass ``git_dir``: a copy of its
    ``.git`` made before. The code could have written ``workdir/.git/config``
    (``core.fsmonitor``, filter drivers) and git would run those commands here,
    outside the sandbox; the copy's config is the one hangar wrote.
    """
    where = ["--git-dir", str(git_dir), "--work-tree", str(workdir)] if git_dir else []
    git(*where, "add", "-A", cwd=workdir)
    diff = ["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", base_sha]
    return git(*where, *diff, cwd=workdir)


def changed_files(patch: str) -> list[str]:
    """Paths a patch touches (both sides of a rename)."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.+?) b/(.+)$", line)
            if m:
                for p in m.groups():
                    if p not in files:
                        files.append(p)
    return files


def apply_patch(workdir: Path, patch: str) -> None:
    """Apply ``patch`` to the checkout in ``workdir``; raise GitError when it does not apply."""
    if not patch.strip():
        return
    git("apply", "--whitespace=nowarn", "--binary", "-", cwd=workdir, input=patch)
