"""Bad input of any shape is refused cleanly: exit 2, no traceback, the field or file named,
nothing written under HANGAR_HOME (issue 14, item 5).

Every case is one malformed spec derived from the bundled example; the bulk runs the CLI
in-process (typer's CliRunner), a handful through the real `hangar` subprocess.
"""

from __future__ import annotations

import copy
import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from hangar_dagster.cli.main import app
from hangar_dagster.experiment.spec import (
    INPUT_BOUNDS,
    MAX_HIDDEN_BYTES,
    MAX_HIDDEN_FILES,
    MAX_PARALLEL,
    MAX_PATCH_BYTES,
    MAX_SPEC_BYTES,
    MAX_TIMEOUT_S,
    MAX_TRIALS,
    json_schema,
)
from hangar_dagster.experiment.spec_yaml import MAX_ALIASES, MAX_DEPTH
from tests.conftest import hangar

pytestmark = pytest.mark.unit

Spec = dict[str, Any]
# A case gets a fresh copy of the valid spec and the example's directory (to write files it
# points at) and returns the spec: a dict (dumped as YAML), text, bytes, or a path to run.
Build = Callable[[Spec, Path], "Spec | str | bytes | Path"]


@dataclass(frozen=True)
class Case:
    id: str
    build: Build
    named: str | tuple[str, ...]  # the field path or file (and more) the refusal must name

    @property
    def names(self) -> tuple[str, ...]:
        return (self.named,) if isinstance(self.named, str) else self.named


CASES: list[Case] = []


def case(id: str, named: str | tuple[str, ...]) -> Callable[[Build], Build]:
    def add(build: Build) -> Build:
        CASES.append(Case(id, build, named))
        return build

    return add


def setting(id: str, named: str, edit: Callable[[Spec], None]) -> None:
    def build(spec: Spec, _: Path) -> Spec:
        edit(spec)
        return spec

    CASES.append(Case(id, build, named))


def put(path: str, value: Any) -> Callable[[Spec], None]:
    """Set the dotted ``path`` (list indexes as numbers) to ``value``, creating mappings."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]

    def edit(spec: Spec) -> None:
        node: Any = spec
        for p in parents:
            if isinstance(p, str) and p not in node:
                node[p] = {}
            node = node[p]
        node[last] = value

    return edit


def drop(path: str) -> Callable[[Spec], None]:
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]

    def edit(spec: Spec) -> None:
        node: Any = spec
        for p in parents:
            node = node[p]
        del node[last]

    return edit


def named(path: str) -> str:
    """The field path as the refusal prints it: tasks.0.id -> tasks[0].id."""
    out = ""
    for p in path.split("."):
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


# --- types: every field given a value of the wrong type -----------------------------------------
WRONG_TYPES: list[tuple[str, Any]] = [
    ("trials", True),
    ("trials", False),
    ("trials", 1.5),
    ("trials", 3.0),
    ("trials", "3"),
    ("trials", "1e9"),
    ("trials", 1e9),
    ("trials", [3]),
    ("trials", None),
    ("parallel", True),
    ("parallel", "1e9"),
    ("parallel", 2.5),
    ("environment.resources.timeout_s", 1e18),
    ("environment.resources.timeout_s", "60"),
    ("environment.resources.timeout_s", True),
    ("environment.resources.memory_mb", 1.0e3),
    ("environment.resources.memory_mb", False),
    ("grader.timeout_s", True),
    ("name", 123),
    ("name", ["skills-ab"]),
    ("name", True),
    ("name", None),
    ("description", 5),
    ("author", 5),
    ("author", ["me"]),
    ("harness_repo", 7),
    ("tasks", "median"),
    ("tasks", {"id": "median"}),
    ("tasks", 5),
    ("tasks.0", "median"),
    ("tasks.0", 5),
    ("tasks.0.id", 5),
    ("tasks.0.id", True),
    ("tasks.0.id", None),
    ("tasks.0.instructions", 5),
    ("tasks.0.repo", 5),
    ("tasks.0.repo", ["repos/median"]),
    ("tasks.0.base", 1234567),
    ("tasks.0.verify", 5),
    ("tasks.0.reference_patch", 5),
    ("tasks.0.hidden_tests", 5),
    ("tasks.0.hidden_tests", ["fixtures/median/hidden"]),
    ("variants", ["plain"]),
    ("variants", "plain"),
    ("variants.plain", "standin"),
    ("variants.plain.harness_lock", 5),
    ("variants.plain.tasks", "median"),
    ("environment", "bwrap"),
    ("environment.sandbox", "docker"),
    ("environment.egress.mode", "all"),
    ("environment.egress.mode", 5),
    ("environment.build", "make"),
    ("grader", "pytest"),
    ("grader.command", 5),
    ("grader.files", ["test_x.py"]),
    ("grader.files", {"test_x.py": 5}),
    ("grader.network", "full"),
    ("grader.pythonpath", "src"),
    ("budget.max_cost_usd", True),
    ("budget.max_cost_usd", "10"),
    ("budget.max_cost_usd", float("inf")),
    ("budget.max_cost_usd", float("nan")),
    ("trial_job_budget", 5),
]
for _i, (_path, _value) in enumerate(WRONG_TYPES):
    setting(f"type-{_i}-{_path}={_value!r}", named(_path), put(_path, _value))

# --- bounds: numbers past their upper (or lower) limit ------------------------------------------
OUT_OF_BOUNDS: list[tuple[str, Any]] = [
    ("trials", MAX_TRIALS + 1),
    ("trials", 1_000_000_000),
    ("trials", 10**30),
    ("trials", 0),
    ("trials", -1),
    ("parallel", MAX_PARALLEL + 1),
    ("parallel", 0),
    ("environment.resources.timeout_s", MAX_TIMEOUT_S + 1),
    ("environment.resources.timeout_s", 10**18),
    ("environment.resources.timeout_s", 0),
    ("environment.resources.memory_mb", 2**21),
    ("environment.resources.memory_mb", 10),
    ("grader.timeout_s", 10**9),
    ("budget.max_cost_usd", 1e12),
    ("budget.max_cost_usd", -1),
]
for _i, (_path, _value) in enumerate(OUT_OF_BOUNDS):
    setting(f"bound-{_i}-{_path}={_value!r}", named(_path), put(_path, _value))


@case("bound-planned-trials", "trials")
def _planned(spec: Spec, _: Path) -> Spec:
    lock = spec["variants"]["plain"]["harness_lock"]
    spec["variants"] = {f"v{i}": {"harness_lock": lock} for i in range(40)}
    spec.pop("baseline", None)  # the example's baseline names a variant this spec replaces
    spec["trials"] = MAX_TRIALS  # 1000 x 3 tasks x 40 variants
    return spec


@case("bound-int-of-5000-digits", "parallel: a number of 5000 characters")
def _long_int(spec: Spec, _: Path) -> str:
    del spec["parallel"]
    return yaml.safe_dump(spec) + "parallel: " + "9" * 5000 + "\n"


# --- missing and unknown fields -----------------------------------------------------------------
for _path in (
    "name",
    "tasks",
    "variants",
    "tasks.0.id",
    "tasks.0.instructions",
    "tasks.0.repo",
    "tasks.0.base",
):
    setting(f"missing-{_path}", named(_path), drop(_path))
setting("missing-budget.max_cost_usd", "budget.max_cost_usd", put("budget", {}))
for _path in (
    "colour",
    "tasks.0.colour",
    "variants.plain.colour",
    "environment.colour",
    "environment.resources.gpu",
    "environment.egress.proxy",
    "grader.colour",
    "budget.colour",
):
    setting(f"unknown-{_path}", named(_path), put(_path, "x"))
setting("unknown-trial-typo", "trails", put("trails", 3))

# --- YAML syntax ----------------------------------------------------------------------------------
SYNTAX = {
    "unclosed-bracket": "name: skills-ab\ntasks: [\n",
    "bad-indentation": "name: skills-ab\n tasks:\n- id: a\n  bad: [1\n",
    "tab-indentation": "name: skills-ab\ntasks:\n\t- id: a\n",
    "unterminated-quote": 'name: "skills-ab\ntrials: 3\n',
    "mapping-in-scalar": "name: a: b\n",
    "empty-file": "",
    "only-a-comment": "# nothing here\n",
    "top-level-list": "- name: skills-ab\n",
    "top-level-scalar": "skills-ab\n",
    "two-documents": "name: a\n---\nname: b\n",
    "nul-byte": "name: skills\x00ab\n",
    "bell-character": "name: skills\x07ab\n",
    "unknown-anchor": "name: *nowhere\n",
}
for _id, _text in SYNTAX.items():
    _where = "(top level)" if _id.startswith(("top", "empty", "only")) else "(file)"
    CASES.append(Case(f"syntax-{_id}", lambda s, d, t=_text: t, _where))


# --- huge and endless inputs ----------------------------------------------------------------------
@case("huge-spec-file", "(file)")
def _huge_spec(spec: Spec, _: Path) -> str:
    return yaml.safe_dump(spec) + "# " + "x" * MAX_SPEC_BYTES + "\n"


@case("endless-spec-dev-zero", "/dev/zero")
def _dev_zero(spec: Spec, _: Path) -> Path:
    return Path("/dev/zero")


@case("endless-spec-fifo", "FIFO")
def _fifo_spec(spec: Spec, d: Path) -> Path:
    fifo = d / "spec.fifo"
    os.mkfifo(fifo)
    return fifo


@case("spec-is-a-directory", "directory")
def _dir_spec(spec: Spec, d: Path) -> Path:
    return d / "fixtures"


@case("spec-does-not-exist", "nowhere.yaml")
def _no_spec(spec: Spec, d: Path) -> Path:
    return d / "nowhere.yaml"


@case("huge-name", "name")
def _huge_name(spec: Spec, _: Path) -> Spec:
    spec["name"] = "n" * 900_000
    return spec


@case("deep-flow-nesting", "nested deeper")
def _deep_flow(spec: Spec, _: Path) -> str:
    return yaml.safe_dump(spec) + "extra: " + "[" * 100_000 + "]" * 100_000 + "\n"


@case("deep-block-nesting", "nested deeper")
def _deep_block(spec: Spec, _: Path) -> str:
    return yaml.safe_dump(spec) + "".join(f"{'  ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5))


@case("reference-patch-dev-zero", "tasks[0].reference_patch")
def _ref_zero(spec: Spec, _: Path) -> Spec:
    spec["tasks"][0]["reference_patch"] = "/dev/zero"
    return spec


@case("reference-patch-fifo", "tasks[0].reference_patch")
def _ref_fifo(spec: Spec, d: Path) -> Spec:
    os.mkfifo(d / "ref.fifo")
    spec["tasks"][0]["reference_patch"] = "ref.fifo"
    return spec


@case("reference-patch-huge", "tasks[1].reference_patch")
def _ref_huge(spec: Spec, d: Path) -> Spec:
    (d / "huge.diff").write_text("diff --git a/x b/x\n" + "+x\n" * (MAX_PATCH_BYTES // 3 + 1))
    spec["tasks"][1]["reference_patch"] = "huge.diff"
    return spec


@case("hidden-file-huge", "tasks[0].hidden_tests")
def _hidden_huge(spec: Spec, d: Path) -> Spec:
    (d / "hidden-huge").mkdir()
    (d / "hidden-huge" / "test_big.py").write_text("#" * (MAX_HIDDEN_BYTES + 1))
    spec["tasks"][0]["hidden_tests"] = "hidden-huge"
    return spec


@case("hidden-dir-too-many-bytes", "tasks[0].hidden_tests")
def _hidden_bytes(spec: Spec, d: Path) -> Spec:
    (d / "hidden-bytes").mkdir()
    for i in range(3):
        (d / "hidden-bytes" / f"test_{i}.py").write_text("#" * (MAX_HIDDEN_BYTES // 2))
    spec["tasks"][0]["hidden_tests"] = "hidden-bytes"
    return spec


@case("hidden-dir-too-many-files", "tasks[0].hidden_tests")
def _hidden_many(spec: Spec, d: Path) -> Spec:
    (d / "hidden-many").mkdir()
    for i in range(MAX_HIDDEN_FILES + 1):
        (d / "hidden-many" / f"test_{i}.py").write_text("x = 1\n")
    spec["tasks"][0]["hidden_tests"] = "hidden-many"
    return spec


@case("hidden-dir-holds-a-fifo", "tasks[0].hidden_tests")
def _hidden_fifo(spec: Spec, d: Path) -> Spec:
    (d / "hidden-fifo").mkdir()
    os.mkfifo(d / "hidden-fifo" / "test_pipe.py")
    spec["tasks"][0]["hidden_tests"] = "hidden-fifo"
    return spec


@case("hidden-dir-is-dev", "tasks[2].hidden_tests")
def _hidden_dev(spec: Spec, _: Path) -> Spec:
    spec["tasks"][2]["hidden_tests"] = "/dev"
    return spec


@case("hidden-file-symlink-to-dev-zero", "test_zero.py")
def _hidden_link(spec: Spec, d: Path) -> Spec:
    (d / "hidden-link").mkdir()
    (d / "hidden-link" / "test_zero.py").symlink_to("/dev/zero")
    spec["tasks"][0]["hidden_tests"] = "hidden-link"
    return spec


# --- encodings: the refusal names the file and the encoding it wants ------------------------------
SPEC_FILE = "malformed.yaml"  # build_case's name for a spec it writes
NOT_UTF8 = "is not UTF-8 text"  # the decoding error, not the fix (which says UTF-8 too)


@case("spec-latin-1", (SPEC_FILE, NOT_UTF8))
def _latin1(spec: Spec, _: Path) -> bytes:
    spec["description"] = "caf\u00e9"
    return yaml.safe_dump(spec, allow_unicode=True).encode("latin-1")


@case("spec-utf-16", (SPEC_FILE, NOT_UTF8))
def _utf16(spec: Spec, _: Path) -> bytes:
    return yaml.safe_dump(spec).encode("utf-16")


@case("spec-invalid-byte", (SPEC_FILE, NOT_UTF8))
def _ff(spec: Spec, _: Path) -> bytes:
    return yaml.safe_dump(spec).encode() + b"# \xff\xfe\n"


@case("spec-truncated-multibyte", (SPEC_FILE, NOT_UTF8))
def _truncated(spec: Spec, _: Path) -> bytes:
    return yaml.safe_dump(spec).encode() + "# \u20ac".encode()[:-1]


@case("spec-encoded-surrogate", (SPEC_FILE, NOT_UTF8))
def _surrogate(spec: Spec, _: Path) -> bytes:
    return yaml.safe_dump(spec).encode() + b"# \xed\xa0\x80\n"


@case("reference-patch-latin-1", ("reference2.diff", NOT_UTF8))
def _ref_latin1(spec: Spec, d: Path) -> Spec:
    (d / "reference2.diff").write_bytes(b"diff --git a/x b/x\n+caf\xe9\n")
    spec["tasks"][0]["reference_patch"] = "reference2.diff"
    return spec


@case("hidden-file-latin-1", ("test_latin.py", NOT_UTF8))
def _hidden_latin1(spec: Spec, d: Path) -> Spec:
    (d / "hidden-latin").mkdir()
    (d / "hidden-latin" / "test_latin.py").write_bytes(b"# caf\xe9\n")
    spec["tasks"][0]["hidden_tests"] = "hidden-latin"
    return spec


# --- traversal ------------------------------------------------------------------------------------
TRAVERSAL: list[tuple[str, Any]] = [
    ("grader.files", {"../evil.py": "x = 1\n"}),
    ("grader.files", {"/etc/evil.py": "x = 1\n"}),
    ("grader.files", {"a\\..\\..\\evil.py": "x = 1\n"}),
    ("grader.files", {"": "x = 1\n"}),
    ("grader.files", {"test_\x07.py": "x = 1\n"}),
    ("tasks.0.hidden_tests", {"../../conftest.py": "x = 1\n"}),
    ("grader.pythonpath", ["../.."]),
    ("grader.pythonpath", ["/usr/lib"]),
]
for _i, (_path, _value) in enumerate(TRAVERSAL):
    setting(f"traversal-{_i}-{_path}", named(_path), put(_path, _value))
setting(
    "traversal-hidden-dir-outside",
    "tasks[0].hidden_tests",
    put("tasks.0.hidden_tests", "../" * 40 + "no/such/dir"),
)
setting(
    "traversal-reference-etc-passwd",
    "tasks[0].reference_patch",
    put("tasks.0.reference_patch", "../" * 40 + "etc/passwd"),
)


# --- files where folders belong (and the reverse) -------------------------------------------------
@case("repo-is-a-file", "tasks[0].repo")
def _repo_file(spec: Spec, _: Path) -> Spec:
    spec["tasks"][0]["repo"] = "fixtures/median/reference.diff"
    return spec


setting("repo-is-dev-null", "tasks[1].repo", put("tasks.1.repo", "/dev/null"))
setting(
    "hidden-tests-is-a-file",
    "tasks[0].hidden_tests",
    put("tasks.0.hidden_tests", "fixtures/median/reference.diff"),
)
setting(
    "reference-patch-is-a-directory",
    "tasks[0].reference_patch",
    put("tasks.0.reference_patch", "fixtures/median/hidden"),
)
setting("harness-repo-is-a-file", "harness_repo", put("harness_repo", "experiment.yaml"))
setting("harness-repo-is-dev-null", "harness_repo", put("harness_repo", "/dev/null"))


# --- YAML bombs, recursion and tags ---------------------------------------------------------------
@case("yaml-billion-laughs", "YAML bomb")
def _bomb(spec: Spec, _: Path) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return yaml.safe_dump(spec) + "\n".join(lines) + "\n"


@case("yaml-deep-alias-chain", "nested deeper")
def _alias_chain(spec: Spec, _: Path) -> str:
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, MAX_DEPTH + 8)]
    return yaml.safe_dump(spec) + "\n".join(lines) + "\n"


@case("yaml-duplicate-alias-keys", "duplicate key")
def _alias_keys(spec: Spec, _: Path) -> str:
    return yaml.safe_dump(spec) + "k: &k colour\nmore:\n  *k : 1\n  *k : 2\n"


@case("yaml-recursive-alias", "recursive alias")
def _recursive(spec: Spec, _: Path) -> str:
    return yaml.safe_dump(spec) + "loop: &loop [*loop]\n"


@case("yaml-too-many-aliases", "aliases")
def _aliases(spec: Spec, _: Path) -> str:
    body = "".join("  - *c\n" for _ in range(MAX_ALIASES + 1))
    return yaml.safe_dump(spec) + "c: &c x\nmany:\n" + body


for _tag in (
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "!custom value",
    "!!binary aGVsbG8=",
    "!!set {a: null}",
    "!!omap [{a: 1}]",
):
    CASES.append(
        Case(
            f"yaml-tag-{_tag.split()[0]}",
            lambda s, d, t=_tag: (
                yaml.safe_dump({k: v for k, v in s.items() if k != "description"})
                + f"description: {t}\n"
            ),
            "description",
        )
    )
setting("yaml-timestamp-base", "tasks[0].base", put("tasks.0.base", datetime.date(2024, 1, 1)))


# --- duplicate keys -------------------------------------------------------------------------------
def duplicated(marker: str, extra: str) -> Build:
    """The example's text with the line ``extra`` inserted after the first line ``marker``."""

    def build(spec: Spec, d: Path) -> str:
        text = (d / "experiment.yaml").read_text()
        assert marker in text, marker
        return text.replace(marker, marker + extra, 1)

    return build


DUPLICATES = [
    ("top-trials", "trials: 3\n", "trials: 5\n", "trials"),
    ("top-name", "name: skills-ab\n", "name: other\n", "name"),
    ("task-id", "  - id: median\n", "    id: slugify\n", "tasks[0].id"),
    ("task-base", "    base: base\n", "    base: main\n", "tasks[0].base"),
    (
        "resources",
        "    timeout_s: 60\n",
        "    timeout_s: 6000\n",
        "environment.resources.timeout_s",
    ),
    ("variant", "  plain:\n", "    harness_lock: x\n", "variants.plain.harness_lock"),
    (
        "grader-command",
        "  command: hangar-grade pytest -q\n",
        "  command: true\n",
        "grader.command",
    ),
]
for _id, _marker, _extra, _where in DUPLICATES:
    CASES.append(Case(f"duplicate-{_id}", duplicated(_marker, _extra), _where))


@case("duplicate-variant-name", "variants.skill")
def _dup_variant(spec: Spec, d: Path) -> str:
    text = (d / "experiment.yaml").read_text()
    return text.replace("variants:\n", "variants:\n  skill:\n    harness_lock: x\n", 1)


@case("duplicate-hidden-file", "grader.files.test_a.py")
def _dup_file(spec: Spec, _: Path) -> str:
    del spec["grader"]
    return yaml.safe_dump(spec) + "grader:\n  files:\n    test_a.py: x\n    test_a.py: y\n"


# --- control characters in ids, names and authors -------------------------------------------------
CONTROL: list[tuple[str, Any]] = [
    ("author", "a\x07b"),
    ("author", "eve\u202egnp.exe"),
    ("author", "a\nb"),
    ("author", "zero\u200bwidth"),
    ("author", "esc\x1b[31m"),
    ("name", "skills-ab\n"),
    ("name", "skills\x00ab"),
    ("tasks.0.id", "median\x1b[31m"),
    ("tasks.1.id", "slug\tify"),
]
for _i, (_path, _value) in enumerate(CONTROL):
    setting(f"control-{_i}-{_path}", named(_path), put(_path, _value))


@case("control-variant-name", "variants")
def _control_variant(spec: Spec, _: Path) -> Spec:
    spec["variants"]["pl\x7fain"] = spec["variants"].pop("plain")
    return spec


# --- the harness ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example(example_dir: Path) -> tuple[Spec, Path]:
    spec: Spec = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    return spec, example_dir


def listing(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*")) if home.exists() else []


def build_case(c: Case, example: tuple[Spec, Path], tmp_path: Path) -> Path:
    base, example_dir = example
    work = tmp_path / "skills-ab"
    # The example's repos, fixtures and harnesses are linked, not copied: 100+ cases stay fast.
    work.mkdir()
    for entry in example_dir.iterdir():
        (work / entry.name).symlink_to(entry)
    built = c.build(copy.deepcopy(base), work)
    if isinstance(built, Path):
        return built
    spec_path = work / SPEC_FILE
    if isinstance(built, bytes):
        spec_path.write_bytes(built)
    else:
        spec_path.write_text(built if isinstance(built, str) else yaml.safe_dump(built))
    return spec_path


def squeeze(text: str) -> str:
    return "".join(text.split())  # rich wraps long lines


def test_there_are_at_least_100_distinct_cases() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 100, len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_a_malformed_spec_is_refused_cleanly(
    c: Case, example: tuple[Spec, Path], tmp_path: Path, hangar_home: Path
) -> None:
    spec_path = build_case(c, example, tmp_path)
    before = listing(hangar_home)
    result = CliRunner().invoke(app, ["experiment", "run", str(spec_path)])
    said = result.output
    assert isinstance(result.exception, SystemExit), (result.exception, said)
    assert result.exit_code == 2, said
    assert "Traceback" not in said
    assert "refused:" in said and "nothing was submitted" in said, said
    assert all(squeeze(name) in squeeze(said) for name in c.names), said
    assert listing(hangar_home) == before


def test_the_valid_base_spec_is_accepted(
    example: tuple[Spec, Path], tmp_path: Path, hangar_home: Path
) -> None:
    """The control: the unmodified spec, built the same way, is submitted (exit 0)."""
    spec_path = build_case(Case("valid", lambda s, d: s, ""), example, tmp_path)
    result = CliRunner().invoke(app, ["experiment", "run", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "submitted" in result.output
    assert listing(hangar_home)


def test_duplicate_keys_name_the_key_and_both_lines(
    example: tuple[Spec, Path], tmp_path: Path, hangar_home: Path
) -> None:
    spec_path = tmp_path / "dup.yaml"
    spec_path.write_text("name: a\ntrials: 1\nparallel: 2\ntrials: 3\n")
    result = CliRunner().invoke(app, ["experiment", "run", str(spec_path)])
    assert result.exit_code == 2
    assert "trials: duplicate key 'trials' at lines 2 and 4" in result.output


# Every spec field with an upper bound: one value past each, all in one spec.
BOUNDED_FIELDS = (
    "trials",
    "parallel",
    "environment.resources.timeout_s",
    "grader.timeout_s",
    "environment.resources.memory_mb",
    "budget.max_cost_usd",
    "trial_job_budget.max_cost_usd",
    "reuse.max_age_days",
)


def test_bounds_are_in_the_message(
    example: tuple[Spec, Path], tmp_path: Path, hangar_home: Path
) -> None:
    """Each over-the-bound value's refusal names the field and the bound's number."""
    bound = {path: INPUT_BOUNDS[path.rsplit(".", 1)[-1]][0] for path in BOUNDED_FIELDS}

    def over(spec: Spec, _: Path) -> Spec:
        for path, limit in bound.items():
            put(path, limit + 1)(spec)
        return spec

    spec_path = build_case(Case("b", over, ""), example, tmp_path)
    said = squeeze(CliRunner().invoke(app, ["experiment", "run", str(spec_path)]).output)
    for path, limit in bound.items():
        assert squeeze(f"{named(path)}: Input should be less than or equal to {limit} ->") in said
    # The table's field bounds are all here (the others bound files and YAML, cases above).
    assert {p.rsplit(".", 1)[-1] for p in BOUNDED_FIELDS} == {
        "trials", "parallel", "timeout_s", "memory_mb", "max_cost_usd", "max_age_days"
    }  # fmt: skip


def test_the_bounds_table_in_the_docs_and_the_schema_is_the_code_s() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = docs.split("## Input bounds", 1)[1].split("\n## ", 1)[0]
    rows = {
        cells[0].strip("` "): cells[1].strip()
        for line in section.splitlines()
        if line.startswith("| `") and (cells := line.strip("|").split("|"))
    }
    assert rows == {k: f"{v:,}" for k, (v, _) in INPUT_BOUNDS.items()}
    assert json_schema()["x-input-bounds"]["trials"] == {
        "max": MAX_TRIALS,
        "unit": INPUT_BOUNDS["trials"][1],
    }


# --- `hangar grade --patch`: the same bounds on the patch file ------------------------------------
PATCHES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "dev-zero": (lambda d: Path("/dev/zero"), "character device"),
    "fifo": (lambda d: (os.mkfifo(d / "p.fifo"), d / "p.fifo")[1], "FIFO"),
    "latin-1": (
        lambda d: (d / "l.diff").write_bytes(b"diff --git a/x b/x\n+caf\xe9\n") and d / "l.diff",
        "not UTF-8",
    ),
    "huge": (
        lambda d: (d / "h.diff").write_bytes(b"+" * (MAX_PATCH_BYTES + 1)) and d / "h.diff",
        "over the limit",
    ),
    "directory": (lambda d: d, "directory"),
}


@pytest.mark.parametrize("kind", sorted(PATCHES))
def test_grade_refuses_a_bad_patch_file_naming_it(
    kind: str, example: tuple[Spec, Path], tmp_path: Path, hangar_home: Path
) -> None:
    make, expected = PATCHES[kind]
    patch = make(tmp_path)
    _, example_dir = example
    result = CliRunner().invoke(
        app,
        ["grade", "--spec", str(example_dir / "experiment.yaml"), "--task", "median",
         "--patch", str(patch)],
    )  # fmt: skip
    said = squeeze(result.output)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, result.output
    assert "Traceback" not in said
    assert squeeze(f"--patch {patch}") in said and squeeze(expected) in said
    assert listing(hangar_home) == []


# --- a handful through the real CLI ---------------------------------------------------------------
REAL = (
    "endless-spec-dev-zero",
    "spec-latin-1",
    "duplicate-top-trials",
    "type-0-trials=True",
    "deep-flow-nesting",
    "reference-patch-dev-zero",
    "repo-is-a-file",
)


@pytest.mark.integration
@pytest.mark.parametrize(
    "c", [c for c in CASES if c.id in REAL], ids=[c.id for c in CASES if c.id in REAL]
)
def test_the_real_cli_refuses_cleanly(c: Case, example: tuple[Spec, Path], tmp_path: Path) -> None:
    spec_path = build_case(c, example, tmp_path)
    home = tmp_path / "home"
    result = hangar("experiment", "run", str(spec_path), home=home, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert all(squeeze(name) in squeeze(result.stderr) for name in c.names), result.stderr
    assert not home.exists()
