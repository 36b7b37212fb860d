"""Operator settings are read in one place: no module but settings.py reads a HANGAR_ variable.

An ast scan of hangar_dagster/**.py for ``os.environ.get(N)``, ``os.environ[N]``,
``os.environ.setdefault(N)``, ``os.getenv(N)`` and ``N in os.environ`` (also through
``from os import environ, getenv``, or a parameter defaulting to ``os.environ``) where
``N`` is a string starting with ``HANGAR_``, or a name any module of the package binds to
one (``WINDOW_VAR = "HANGAR_EVAL_WINDOW"``, and names imported from there). Allowed:
settings.py (the one place) and the in-sandbox programs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hangar_dagster

pytestmark = pytest.mark.unit

PACKAGE = Path(hangar_dagster.__file__).parent
PREFIX = "HANGAR_"
# Programs that run inside a sandbox and read the variables the sandbox was given: the
# grader's and the stand-in agent's contract, not operator settings.
IN_SANDBOX = frozenset(
    {
        "grading/pytest_plugin.py",
        "grading/reporter.py",
        "grading/hangar_grade.py",
        "standins/agent_main.py",
    }
)
ALLOWED = IN_SANDBOX | {"settings.py"}


def hangar_constants(trees: list[ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "HANGAR_..."`` bindings of every module (names are global here)."""
    found: dict[str, str] = {}
    for tree in trees:
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and node.value.value.startswith(PREFIX)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value.value
    return found


def _names(node: ast.expr | None, constants: dict[str, str]) -> str | None:
    """The HANGAR_ variable ``node`` names, if it names one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value.startswith(PREFIX) else None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        if isinstance(head, ast.Constant) and str(head.value).startswith(PREFIX):
            return f"{head.value}..."
    return None


def _is_environ(node: ast.expr, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id in aliases


def environ_reads(tree: ast.Module, constants: dict[str, str]) -> list[tuple[int, str]]:
    """(line, variable) of every read of a HANGAR_ variable from the process environment."""
    environ_aliases, getenv_aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name == "environ":
                    environ_aliases.add(a.asname or a.name)
                if a.name == "getenv":
                    getenv_aliases.add(a.asname or a.name)
        # ``def f(environ=os.environ)``: ``environ`` is the process environment in that module.
        if isinstance(node, ast.FunctionDef):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults))
            for arg, default in zip(
                args, [*defaults, *node.args.defaults, *node.args.kw_defaults], strict=True
            ):
                if default is not None and _is_environ(default, set()):
                    environ_aliases.add(arg.arg)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        name: str | None = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr in ("get", "setdefault", "pop")
                and _is_environ(f.value, environ_aliases)
            ) or (
                (isinstance(f, ast.Attribute) and f.attr == "getenv")
                and isinstance(f.value, ast.Name)
                and f.value.id == "os"
                or (isinstance(f, ast.Name) and f.id in getenv_aliases)
            ):
                name = _names(node.args[0], constants)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value, environ_aliases):
            name = _names(node.slice, constants)
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _is_environ(node.comparators[0], environ_aliases)
        ):
            name = _names(node.left, constants)
        if name is not None:
            out.append((getattr(node, "lineno", 0), name))
    return sorted(out)


def _package() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_only_settings_reads_hangar_variables() -> None:
    modules = _package()
    constants = hangar_constants(list(modules.values()))
    offenders = [
        f"hangar_dagster/{path}:{line} reads {name}"
        for path, tree in modules.items()
        if path not in ALLOWED
        for line, name in environ_reads(tree, constants)
    ]
    assert offenders == [], (
        "read operator variables through settings.Settings (one place, docs/operations.md):\n"
        + "\n".join(offenders)
    )


def test_the_in_sandbox_exceptions_exist_and_do_read_their_contract() -> None:
    modules = _package()
    constants = hangar_constants(list(modules.values()))
    assert IN_SANDBOX <= set(modules)
    # The scan sees what they read: without it the allow-list would hide nothing.
    assert environ_reads(modules["grading/pytest_plugin.py"], constants)
    assert environ_reads(modules["grading/reporter.py"], constants)


SAMPLE = """
import os
from os import environ as env, getenv
from elsewhere import WINDOW_VAR

LOCAL_VAR = "HANGAR_LOCAL"

def reads():
    os.environ.get("HANGAR_A")
    os.environ["HANGAR_B"]
    os.getenv("HANGAR_C", "x")
    env.get(LOCAL_VAR)
    getenv(WINDOW_VAR)
    "HANGAR_D" in os.environ
    os.environ.get(f"HANGAR_{'E'}_BASE_URL")
    os.environ.setdefault("HANGAR_F", "1")

def window_from_env(environ=os.environ):
    return environ.get(LOCAL_VAR)

def fine():
    os.environ.get("HOME")
    os.environ.get(NOT_A_HANGAR_NAME)
    {k: v for k, v in os.environ.items() if not k.startswith("HANGAR_")}
    settings.get("HANGAR_G")
"""


def test_the_scan_catches_each_way_of_reading_a_variable() -> None:
    tree = ast.parse(SAMPLE)
    constants = hangar_constants([tree, ast.parse('WINDOW_VAR = "HANGAR_EVAL_WINDOW"')])
    assert [name for _, name in environ_reads(tree, constants)] == [
        "HANGAR_A",
        "HANGAR_B",
        "HANGAR_C",
        "HANGAR_LOCAL",
        "HANGAR_EVAL_WINDOW",
        "HANGAR_D",
        "HANGAR_...",
        "HANGAR_F",
        "HANGAR_LOCAL",
    ]
