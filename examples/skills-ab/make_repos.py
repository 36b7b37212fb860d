"""Build the example's task repositories from fixtures/ (run it as a program).

    python examples/skills-ab/make_repos.py [--out DIR] [--write-reference]

Each fixtures/<task>/ holds ``repo/`` (the buggy files), ``later/`` (what a
later upstream commit changes: the fix and a regression test), ``hidden/``
(the grader's tests) and ``reference.diff``. Every task becomes a git
repository with the buggy state tagged ``base`` and the later fix on top of
it (``main`` and the branch ``later``), so a test can show that a trial's
clone cannot reach the answer. Identity and dates are fixed and user config
is ignored, so re-running gives the same SHAs. ``--write-reference``
regenerates each reference.diff from ``git diff base later``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from hangar_dagster.util.gitrepo import git

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
TASKS = (
    "median",
    "slugify",
    "durations",
    "leap-year",
    "chunked",
    "word-count",
    "dedupe",
    "versions",
    "flatten",
    "csv-line",
)
# Fixed dates (besides gitrepo's fixed identity) make the commit SHAs reproducible.
BASE_DATE = "2026-01-05T09:00:00+00:00"
LATER_DATE = "2026-01-12T09:00:00+00:00"


def _copy_tree(src: Path, dest: Path) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_file():
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)  # content only: modes stay the umask default


def _commit(repo: Path, message: str, date: str) -> None:
    os.environ["GIT_AUTHOR_DATE"] = date
    os.environ["GIT_COMMITTER_DATE"] = date
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--no-verify", "-m", message, cwd=repo)


def make_repo(task: str, out: Path) -> Path:
    """(Re)create ``out/<task>``: built beside it, then swapped in (a failure keeps the old one)."""
    fixture = FIXTURES / task
    for part in ("repo", "later", "hidden"):
        if not (fixture / part).is_dir():
            raise SystemExit(f"{fixture / part}: missing; a fixture needs repo/, later/, hidden/")
    dest = out / task
    tmp = out / f".tmp-{task}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(tmp))
    _copy_tree(fixture / "repo", tmp)
    _commit(tmp, f"{task}: import the module and its tests", BASE_DATE)
    git("tag", "base", cwd=tmp)
    _copy_tree(fixture / "later", tmp)
    _commit(tmp, f"{task}: fix the bug upstream, with a regression test", LATER_DATE)
    git("branch", "later", cwd=tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def reference_diff(repo: Path) -> str:
    return git("diff", "--no-color", "--no-ext-diff", "base", "later", cwd=repo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE / "repos", help="where repos go")
    parser.add_argument(
        "--write-reference", action="store_true", help="rewrite fixtures/<task>/reference.diff"
    )
    parser.add_argument(
        "--task",
        action="append",
        choices=TASKS,
        help="build only this task's repo (repeatable; default: every task)",
    )
    args = parser.parse_args(argv)
    # No system or user git config: a signing key or autocrlf there would change the SHAs.
    os.environ["GIT_CONFIG_GLOBAL"] = os.devnull
    for task in args.task or TASKS:
        repo = make_repo(task, args.out.resolve())
        if args.write_reference:
            (FIXTURES / task / "reference.diff").write_text(reference_diff(repo))
        base = git("rev-parse", "base", cwd=repo).strip()
        print(f"{task}: {repo} base {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
