"""The grader's pure parts: digest, hidden file merge, canary line, runner and trust."""

from __future__ import annotations

from pathlib import Path

import pytest
from grading_builders import HIDDEN, experiment

from hangar_dagster.experiment.spec import Grader, hidden_path_problem
from hangar_dagster.grading.grader import (
    grade_trust,
    grader_digest,
    grader_runner,
    hidden_files_for,
    with_canary,
    write_hidden_files,
)

pytestmark = pytest.mark.unit

CANARY = "HANGAR-CANARY-feedface"


def test_digest_covers_command_files_and_settings_but_not_the_canary() -> None:
    files = {"t1": {"test_a.py": "def test(): pass\n"}}
    base = grader_digest(Grader(canary="HANGAR-CANARY-one"), files)
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    assert grader_digest(Grader(canary="HANGAR-CANARY-two"), files) == base
    others = [
        grader_digest(Grader(command="hangar-grade pytest -x"), files),
        grader_digest(Grader(network="mirror"), files),
        grader_digest(Grader(files_mode="in_repo"), files),
        grader_digest(Grader(timeout_s=5), files),
        grader_digest(Grader(files={"shared.py": "x = 1\n"}), files),
        grader_digest(Grader(), {"t1": {"test_a.py": "def test(): assert 0\n"}}),
        grader_digest(Grader(), {"t2": files["t1"]}),
    ]
    assert len({base, *others}) == len(others) + 1


def test_hidden_files_merge_shared_and_task_files_task_wins(tmp_path: Path) -> None:
    exp = experiment(
        {
            "t": {
                "repo": str(tmp_path),
                "base_sha": "a" * 40,
                "hidden_files": {**HIDDEN, "helper.py": "task\n"},
            }
        },
        grader={"files": {"helper.py": "shared\n", "data.txt": "1\n"}},
    )
    assert hidden_files_for(exp, "t") == {**HIDDEN, "helper.py": "task\n", "data.txt": "1\n"}


@pytest.mark.parametrize(
    ("path", "content", "expected"),
    [
        ("test_a.py", "import os\n", f"# {CANARY}\nimport os\n"),
        ("sub/conf.toml", "[x]\n", f"# {CANARY}\n[x]\n"),
        ("conf.yaml", "a: 1\n", f"# {CANARY}\na: 1\n"),
        ("setup.cfg", "[x]\n", f"# {CANARY}\n[x]\n"),
        ("run.sh", "#!/bin/sh\necho hi\n", f"#!/bin/sh\n# {CANARY}\necho hi\n"),
        (
            "test_b.py",
            "#!/usr/bin/env python\n# -*- coding: latin-1 -*-\nx = 1\n",
            f"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\n# {CANARY}\nx = 1\n",
        ),
        ("test_c.py", "", f"# {CANARY}\n"),
        ("x.test.js", "test('a', () => {})\n", f"// {CANARY}\ntest('a', () => {{}})\n"),
        ("fixture.json", '{"a": 1}\n', '{"a": 1}\n'),  # JSON takes no comments
        ("blob.bin", "\x00\x01", "\x00\x01"),
    ],
)
def test_canary_line_goes_where_the_file_type_allows(
    path: str, content: str, expected: str
) -> None:
    assert with_canary(path, content, CANARY) == expected


@pytest.mark.parametrize("path", ["expected_output.txt", "golden/out.TXT", "data.csv", "x.md"])
def test_with_canary_leaves_golden_txt_and_data_files_as_given(path: str) -> None:
    # A golden output compared byte for byte must stay byte for byte what the spec gave.
    golden = "line one\nline two\n"
    assert with_canary(path, golden, CANARY) == golden


def test_write_hidden_files_counts_marked_files_and_refuses_escaping_paths(tmp_path: Path) -> None:
    dest = tmp_path / "hidden"
    assert write_hidden_files(dest, {"test_a.py": "x = 1\n", "d/data.json": "{}"}, CANARY) == 1
    assert (dest / "test_a.py").read_text().startswith(f"# {CANARY}\n")
    assert (dest / "d" / "data.json").read_text() == "{}"
    for bad in ("../escape.py", "/abs/test.py", "", "a\\b.py"):
        assert hidden_path_problem(bad) is not None
        with pytest.raises(ValueError, match="hidden file path"):
            write_hidden_files(tmp_path / "other", {bad: "x"}, CANARY)
    assert not (tmp_path / "escape.py").exists()


@pytest.mark.parametrize(
    ("command", "files_mode", "runner", "trust"),
    [
        ("hangar-grade pytest -q", "hidden", "hangar-grade", "best_effort"),
        ("  hangar-grade pytest -k 'not slow'", "hidden", "hangar-grade", "best_effort"),
        ("hangar-grade pytest -q", "in_repo", "hangar-grade", "low"),
        ("python -m pytest $HANGAR_HIDDEN_TESTS", "hidden", "command", "low"),
        ("hangar-grade pytest -q; echo ok", "hidden", "command", "low"),
        ("hangar-grade pytest -q && cp x $HANGAR_GRADE_JUNIT", "hidden", "command", "low"),
        ("hangar-grade pytest 'unclosed", "hidden", "command", "low"),
        ("/usr/bin/hangar-grade pytest", "hidden", "command", "low"),
    ],
)
def test_runner_and_trust(command: str, files_mode: str, runner: str, trust: str) -> None:
    grader = Grader.model_validate({"command": command, "files_mode": files_mode})
    assert grader_runner(command) == runner
    assert grade_trust(grader) == trust


def test_a_module_loads_from_the_hidden_dir_only_through_a_hidden_file(tmp_path: Path) -> None:
    # identity trusts a module's globals when its __file__ is a hidden file: by inode, so a
    # symlink to one counts (as realpath would), a path that names no file or any other file
    # does not (a __file__ string claiming the hidden dir is not enough).
    from hangar_dagster.grading.identity import _inode, _inodes

    hidden, elsewhere = tmp_path / "hidden", tmp_path / "repo"
    (hidden / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (hidden / "helpers.py").write_text("X = 1\n")
    (hidden / "sub" / "more.py").write_text("Y = 1\n")
    (elsewhere / "calc.py").write_text("Z = 1\n")
    (elsewhere / "link.py").symlink_to(hidden / "helpers.py")
    files = _inodes(str(hidden))
    assert _inode(str(hidden / "helpers.py")) in files
    assert _inode(str(hidden / "sub" / "more.py")) in files
    assert _inode(str(elsewhere / "link.py")) in files
    assert _inode(str(elsewhere / "calc.py")) not in files
    assert _inode(str(hidden / "not_there.py")) is None
    assert _inode("bad\0name") is None
