"""Without the ``hud`` package, a HUD v6 env file, row or agent gets one line saying what to install.

Runs with or without hud installed: the CLI subprocesses get a ``sitecustomize`` that makes every
``import hud`` fail the way a missing package does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import rollouts
from hud_paths import QUICKSTART

from durable_rollouts.errors import ConfigError
from durable_rollouts.hud_detect import HUD_INSTALL_HINT, import_hud, missing_hud

AGENTS = Path(__file__).resolve().parent / "hud_agents.py"

HIDE_HUD = '''
import sys

class _NoHud:
    def find_spec(self, name, path=None, target=None):
        if name == "hud" or name.startswith("hud."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoHud())
'''


@pytest.fixture
def no_hud(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(HIDE_HUD)
    from cli_helpers import cli_env

    return {"PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}"}


def _one_line_exit_2(result) -> None:
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and HUD_INSTALL_HINT in lines[0], result.err


def test_serving_a_hud_env_file_without_hud_says_what_to_install(no_hud: dict[str, str]) -> None:
    _one_line_exit_2(rollouts("serve", str(QUICKSTART), **no_hud))


def test_running_a_hud_env_file_without_hud_says_what_to_install(no_hud: dict[str, str]) -> None:
    _one_line_exit_2(rollouts("run", str(QUICKSTART), "--agent", "fixed", **no_hud))


def test_a_hud_agent_without_hud_says_what_to_install(no_hud: dict[str, str], tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"env": "letter-count", "id": "count_letter"}\n')
    _one_line_exit_2(rollouts("run", str(rows), "--agent", f"{AGENTS}:LetterCounter",
                              "--runtime", f"local:{QUICKSTART}", **no_hud))


def test_the_hint_names_the_extra_and_other_import_errors_pass_through() -> None:
    error = missing_hud(ModuleNotFoundError("No module named 'hud.eval'", name="hud.eval"), "env.py")
    assert isinstance(error, ConfigError) and "pip install 'durable-rollouts[hud]'" in str(error)
    assert missing_hud(ModuleNotFoundError("No module named 'hudson'", name="hudson"), "env.py") is None
    assert missing_hud(ImportError("cannot import name 'x'"), "env.py") is None
    with pytest.raises(ModuleNotFoundError):
        import_hud("no_such_module_xyz", "a test")
