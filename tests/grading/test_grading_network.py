"""The grader's network: sealed under ``none``; under ``mirror``, the package mirror and nothing else.

A real grader run (``run_grader``, bwrap, the uid split when root) whose command installs a
real package from the session's mirror before the hidden tests, which import it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from grading_builders import experiment

from hangar_dagster.environment.mirror import Mirror
from hangar_dagster.grading.grader import run_grader
from hangar_dagster.settings import Settings
from tests.netfixtures import Listener

pytestmark = [pytest.mark.slow, pytest.mark.needs_sandbox("bwrap")]

HIDDEN = {
    "test_uses_six.py": (
        "import sys\n\n\n"
        "def test_six_came_from_the_mirror():\n"
        "    sys.path.insert(0, '/tmp/site')\n"
        "    import six\n\n"
        "    assert six.__version__ == '1.16.0'\n"
    )
}
PLAIN_PYTEST = (
    'python -m pytest -q -p no:cacheprovider --junitxml "$HANGAR_GRADE_JUNIT" '
    '"$HANGAR_HIDDEN_TESTS"'
)
INSTALL = (
    f"{sys.executable} -m pip install -q --no-deps --retries 0 --timeout 10 "
    "--target /tmp/site six==1.16.0"
)


@pytest.mark.parametrize("network", ["none", "mirror"])
def test_the_grader_reaches_the_mirror_only_with_network_mirror(
    network: str,
    task_repo: tuple[Path, str],
    tmp_path: Path,
    package_mirror: tuple[Settings, Mirror],
) -> None:
    repo, base = task_repo
    settings, _ = package_mirror
    exp = experiment(
        {"t1": {"repo": str(repo), "base_sha": base, "hidden_files": HIDDEN}},
        grader={"command": f"{INSTALL} && hangar-grade pytest -q", "network": network},
    )
    run = run_grader(
        exp, "t1", "", label="net", work_root=tmp_path / "work", env_extra={}, settings=settings
    )
    if network == "none":
        assert run.passed is False
        assert run.counts["total"] == 0, run.output  # pip failed: no test ran
        assert "--- egress" not in run.output  # sealed: no proxy at all
        return
    assert run.passed is True, run.output
    assert run.counts["passed"] == 1
    assert "--- egress (mirror) ---" in run.output and "0 refused" in run.output


def test_a_grader_with_network_mirror_reaches_no_other_host_port(
    task_repo: tuple[Path, str], tmp_path: Path
) -> None:
    with Listener() as mirror, Listener() as outside:
        probe = (
            "import os, urllib.request\n\n\n"
            "def test_probe():\n"
            f"    assert urllib.request.urlopen({mirror.url + 'simple/'!r}, timeout=10).status == 200\n"
            "    proxy = urllib.request.ProxyHandler({'http': os.environ['http_proxy']})\n"
            "    os.environ.pop('no_proxy', None); os.environ.pop('NO_PROXY', None)\n"
            "    try:\n"
            f"        urllib.request.build_opener(proxy).open({outside.url!r}, timeout=10)\n"
            "    except urllib.error.HTTPError as err:\n"
            "        assert err.code == 403\n"
            "    else:\n"
            "        raise AssertionError('reached the outside listener')\n"
        )
        repo, base = task_repo
        exp = experiment(
            {"t1": {"repo": str(repo), "base_sha": base, "hidden_files": {"test_probe.py": probe}}},
            # A plain pytest: hangar-grade keeps only its own variables (no proxy settings), so
            # the grader command is where installs happen; here the probe needs them.
            grader={"command": PLAIN_PYTEST, "network": "mirror"},
        )
        home = tmp_path / "home"
        settings = Settings(home=home, dagster_home=home, package_mirror_url=mirror.url + "simple/")
        run = run_grader(
            exp, "t1", "", label="probe", work_root=tmp_path / "work", env_extra={},
            settings=settings,
        )  # fmt: skip
        assert run.passed is True, run.output
        assert outside.connections == []  # refused at the proxy: never reached
        assert len(mirror.connections) == 1  # the control: the allowed one did receive
    assert f"refused: GET 127.0.0.1:{outside.port}" in run.output
