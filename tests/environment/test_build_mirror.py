"""Builds through the real package mirror (``open_egress("mirror")``, environment/egress.py).

These use the build's real network seam, ``build.open_build_egress``: the egress proxy on a unix
socket and the mirror behind it (``mirror.ensure_mirror``). They need the egress branch (issue
10 items 2 and 3) merged; until then ``open_build_egress`` cannot import the egress module and
they fail with that ModuleNotFoundError. The build tests that are not about the network use a
local wheel index instead (tests/buildfixtures.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hangar_dagster.environment.build import BuildFailed, ensure_build, plan_build
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.settings import Settings
from tests.gitfixtures import Upstream

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    return Upstream(tmp_path)


def test_a_task_requirement_installs_through_the_mirror_and_every_request_is_logged(
    upstream: Upstream, tmp_path: Path, hangar_home: Path
) -> None:
    settings = Settings.from_env()
    plan = plan_build(Environment(), str(upstream.path), upstream.base, ["pip install six==1.16.0"])
    assert plan is not None
    built = ensure_build(plan, settings)
    version = subprocess.run(
        [str(built.python), "-c", "import six, pytest; print(six.__version__, pytest.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert version == ["1.16.0", plan.runner.split("==")[1]]
    lines = [json.loads(x) for x in (built.root / "egress.jsonl").read_text().splitlines() if x]
    assert lines and all(line["verdict"] == "allowed" for line in lines), lines


def test_a_build_reaches_nothing_but_the_mirror(
    upstream: Upstream, tmp_path: Path, hangar_home: Path
) -> None:
    settings = Settings.from_env()
    fetch = "python -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/', timeout=20)\""
    plan = plan_build(Environment(build=[fetch]), str(upstream.path), upstream.base)
    assert plan is not None
    with pytest.raises(BuildFailed) as caught:
        ensure_build(plan, settings)
    assert caught.value.step == fetch and caught.value.exit_code not in (0, None)
