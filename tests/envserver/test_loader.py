"""Loading a user's file (``envserver.loader.import_file``): its siblings import, sys.path stays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durable_rollouts.envserver import load_environment
from durable_rollouts.envserver.loader import import_file


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_an_env_file_imports_its_sibling_modules_without_touching_sys_path(tmp_path: Path) -> None:
    folder = tmp_path / "proj"
    _write(folder, {
        "loader_sibling_words.py": "WORD = 'strawberry'\n",
        "env.py": "from durable_rollouts.envserver import Environment\n"
                  "import loader_sibling_words\n"
                  "env = Environment(name=loader_sibling_words.WORD)\n",
    })
    path, finders = list(sys.path), list(sys.meta_path)
    assert load_environment(str(folder / "env.py")).name == "strawberry"
    assert sys.path == path and sys.meta_path == finders  # nothing left behind
    sys.modules.pop("loader_sibling_words", None)
    with pytest.raises(ImportError):  # the folder is importable only while the file runs
        __import__("loader_sibling_words")


def test_a_sibling_shadows_an_installed_module_as_in_a_script(tmp_path: Path) -> None:
    """The folder comes before site-packages (what ``python file.py`` does), after built-ins."""
    _write(tmp_path, {"pydantic_settings.py": "SHADOW = True\n",
                      "main.py": "import pydantic_settings\nSEEN = pydantic_settings\n"})
    saved = sys.modules.pop("pydantic_settings", None)
    try:
        module = import_file(tmp_path / "main.py", "loader_test_main")
        assert getattr(module.SEEN, "SHADOW", False)
    finally:
        sys.modules.pop("pydantic_settings", None)
        sys.modules.pop("loader_test_main", None)
        if saved is not None:
            sys.modules["pydantic_settings"] = saved


def test_a_file_that_raises_is_not_left_in_sys_modules(tmp_path: Path) -> None:
    _write(tmp_path, {"broken.py": "raise RuntimeError('boom')\n"})
    finders = list(sys.meta_path)
    with pytest.raises(RuntimeError, match="boom"):
        import_file(tmp_path / "broken.py", "loader_test_broken")
    assert "loader_test_broken" not in sys.modules and sys.meta_path == finders
