"""harness.yaml and harnesses.lock.yaml go through the same bounded loader as the spec.

``yaml.safe_load`` lets the second of two equal keys win silently and expands an alias bomb in
memory; a harness file is as much operator input as the spec, so it gets the same refusals,
each naming the file and the place.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hangar_dagster.experiment.harness import HarnessError, freeze, read_cli_pins

pytestmark = pytest.mark.unit

GOOD = "name: h\nagent: {adapter: command, cli: sh, version: '1', command: 'true'}\nmodel: m\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8)
)


def harness(tmp_path: Path, text: str) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "harness.yaml").write_text(text)
    return src


def test_a_well_formed_harness_still_freezes(tmp_path: Path) -> None:
    lock = freeze(harness(tmp_path, GOOD), tmp_path / "registry")
    assert lock.ref.startswith("h@sha256:")


def test_duplicate_key_in_harness_yaml_is_refused_naming_the_key(tmp_path: Path) -> None:
    src = harness(tmp_path, GOOD + "model: other\n")
    with pytest.raises(HarnessError) as info:
        freeze(src, tmp_path / "registry")
    message = str(info.value)
    assert str(src / "harness.yaml") in message
    assert "duplicate key 'model'" in message


def test_alias_bomb_in_harness_yaml_is_refused_before_it_expands(tmp_path: Path) -> None:
    src = harness(tmp_path, GOOD + BOMB)
    with pytest.raises(HarnessError) as info:
        freeze(src, tmp_path / "registry")
    assert str(src / "harness.yaml") in str(info.value)
    assert "expands to more than" in str(info.value)


def test_harness_yaml_that_is_a_fifo_is_refused_not_read_forever(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "harness.yaml")
    with pytest.raises(HarnessError) as info:
        freeze(src, tmp_path / "registry")
    assert "not a regular file" in str(info.value)


def test_oversized_harness_yaml_is_refused_with_the_limit(tmp_path: Path) -> None:
    src = harness(tmp_path, GOOD + "description: '" + "x" * 2_000_000 + "'\n")
    with pytest.raises(HarnessError) as info:
        freeze(src, tmp_path / "registry")
    assert "bytes" in str(info.value)


def test_duplicate_cli_pin_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "harnesses.lock.yaml").write_text("clis:\n  claude: '2.0.5'\n  claude: '2.0.6'\n")
    with pytest.raises(HarnessError) as info:
        read_cli_pins(tmp_path)
    assert str(tmp_path / "harnesses.lock.yaml") in str(info.value)
    assert "duplicate key 'claude'" in str(info.value)


def test_provider_retries_freeze_into_the_lock(tmp_path: Path) -> None:
    text = GOOD + "provider_retries: {max_retries: 2, timeout_s: 60}\n"
    lock = freeze(harness(tmp_path, text), tmp_path / "registry")
    assert lock.config["provider_retries"] == {"max_retries": 2, "timeout_s": 60}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("{max_retries: true}", "provider_retries.max_retries must be a whole number from 0 to 20"),
        ("{max_retries: 21}", "provider_retries.max_retries must be a whole number from 0 to 20"),
        ("{timeout_s: 0}", "provider_retries.timeout_s must be a whole number from 1 to 3600"),
        ("{timeout_s: 1.5}", "provider_retries.timeout_s must be a whole number from 1 to 3600"),
        ("{retries: 2}", "unknown provider_retries field(s) retries"),
        ("3", "provider_retries must be a mapping"),
    ],
)
def test_bad_provider_retries_are_refused_naming_the_field(
    tmp_path: Path, value: str, named: str
) -> None:
    src = harness(tmp_path, GOOD + f"provider_retries: {value}\n")
    with pytest.raises(HarnessError, match=named.replace("(", r"\(").replace(")", r"\)")):
        freeze(src, tmp_path / "registry")
