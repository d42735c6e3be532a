"""The one settings object (``durable_rollouts.settings``): read when needed, typed, documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from durable_rollouts.errors import ConfigError
from durable_rollouts.settings import PROCESS_NAMES, Settings, markdown_table, settings, var
from durable_rollouts.workflows.types import DEFAULT_TASK_QUEUE

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "durable_rollouts"


def test_the_readme_settings_section_is_the_generated_table() -> None:
    """README.md's "## Settings" holds exactly ``markdown_table()``: regenerate it with
    ``python -c "from durable_rollouts.settings import markdown_table; print(markdown_table())"``."""
    readme = (REPO / "README.md").read_text()
    assert "\n## Settings\n" in readme
    section = readme.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    tables = re.findall(r"(?:^\|.*\|\n)+", section, flags=re.M)
    generated = re.findall(r"(?:^\|.*\|\n)+", markdown_table() + "\n", flags=re.M)
    assert tables == generated


def test_every_rollouts_variable_the_package_names_is_a_setting_or_a_process_name() -> None:
    """No ``ROLLOUTS_*`` name in the package (code or docstrings) is missing from the object."""
    known = {var(field) for field in Settings.model_fields} | set(PROCESS_NAMES)
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"ROLLOUTS_[A-Z_]*[A-Z]", path.read_text()))
    assert named - known == set()


def test_only_the_settings_module_reads_rollouts_variables_from_the_environment() -> None:
    """Reads go through ``settings()``: no ``os.environ``/``getenv``/click ``envvar`` of a
    ``ROLLOUTS_*`` name elsewhere in the package."""
    reads = re.compile(r"(environ\.get\(|environ\[|getenv\(|envvar=)\s*[\"']ROLLOUTS_")
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in PACKAGE.rglob("*.py")
                 if path.name != "settings.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if reads.search(line)]
    assert offenders == []


def test_values_are_read_when_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROLLOUTS_HOME", str(tmp_path))
    monkeypatch.setenv("ROLLOUTS_GC_EVERY", "12.5")
    monkeypatch.setenv("ROLLOUTS_SQLITE_SYNC", "full")
    monkeypatch.setenv("ROLLOUTS_TASK_QUEUE", "")  # empty: unset
    first = settings()
    assert (first.home, first.gc_every, first.sqlite_sync) == (tmp_path, 12.5, "FULL")
    assert first.task_queue == DEFAULT_TASK_QUEUE
    monkeypatch.setenv("ROLLOUTS_GC_EVERY", "0")
    monkeypatch.setenv("ROLLOUTS_TASK_QUEUE", "mine")
    assert (settings().gc_every, settings().task_queue) == (0.0, "mine")


def test_a_bad_value_is_a_config_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_STORAGE_THRESHOLD", "lots")
    with pytest.raises(ConfigError, match=r"^ROLLOUTS_STORAGE_THRESHOLD='lots': "):
        settings()
    monkeypatch.setenv("ROLLOUTS_STORAGE_THRESHOLD", "-1")
    with pytest.raises(ConfigError, match="ROLLOUTS_STORAGE_THRESHOLD='-1'"):
        settings()


def test_secrets_stay_out_of_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_TOKEN_SECRET", "hunter2")
    monkeypatch.setenv("ROLLOUTS_PAYLOAD_KEY", "swordfish")
    current = settings()
    assert current.token_secret is not None and current.payload_key is not None
    assert (current.token_secret.get_secret_value(), current.payload_key.get_secret_value()) == (
        "hunter2", "swordfish")
    assert "hunter2" not in repr(current) and "swordfish" not in str(current)


def test_the_settings_defaults_match_the_constants_they_stand_for() -> None:
    from durable_rollouts.temporal.storage import STORAGE_ENV
    from durable_rollouts.worker import DEFAULT_GC_EVERY_S, GC_EVERY_ENV

    assert Settings.model_fields["task_queue"].default == DEFAULT_TASK_QUEUE
    assert (DEFAULT_GC_EVERY_S, GC_EVERY_ENV, STORAGE_ENV) == (300.0, "ROLLOUTS_GC_EVERY",
                                                               "ROLLOUTS_STORAGE")


def test_a_subprocess_sees_the_environment_it_inherits(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from durable_rollouts.paths import rollouts_home; "
                               "print(rollouts_home())"],
        env={"ROLLOUTS_HOME": str(tmp_path / "child"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == str(tmp_path / "child")
