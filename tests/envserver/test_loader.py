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


async def test_a_slow_env_file_loads_off_the_event_loop_once_for_concurrent_callers(
        tmp_path: Path) -> None:
    """``load_environment_async``: the file runs in a thread (the loop keeps ticking), once for
    five concurrent callers, who all get the whole module's Environment; its sibling is importable
    by the thread running it, never by the loop meanwhile."""
    import asyncio
    import time

    from durable_rollouts.envserver.loader import load_environment_async

    folder = tmp_path / "slowproj"
    runs = tmp_path / "runs.log"
    _write(folder, {
        "loader_slow_sibling.py": "WORD = 'banana'\n",
        "env.py": "import time\n"
                  f"open({str(runs)!r}, 'a').write('ran\\n')\n"
                  "time.sleep(1.0)\n"
                  "import loader_slow_sibling\n"
                  "from durable_rollouts.envserver import Environment\n"
                  "env = Environment(name=loader_slow_sibling.WORD)\n",
    })
    ticks = 0
    seen_sibling = []

    async def tick() -> None:
        nonlocal ticks
        began = time.monotonic()
        while time.monotonic() - began < 0.9:
            await asyncio.sleep(0.05)
            ticks += 1
            if time.monotonic() - began > 0.5:  # (the file imports it after its 1 s sleep)
                continue
            try:  # the env's folder is not on the loop thread's path while the file runs
                __import__("loader_slow_sibling")
                seen_sibling.append(True)
            except ImportError:
                pass

    *envs, _ = await asyncio.gather(*(load_environment_async(str(folder / "env.py"))
                                      for _ in range(5)), tick())
    assert ticks >= 9, ticks  # ~18 when the loop is free; 1 if the import had blocked it
    assert not seen_sibling
    assert {id(e) for e in envs} == {id(envs[0])} and envs[0].name == "banana"
    assert runs.read_text() == "ran\n"
    began = time.monotonic()  # loaded: the next call neither imports nor waits
    assert await load_environment_async(str(folder / "env.py")) is envs[0]
    assert time.monotonic() - began < 0.5
    sys.modules.pop("loader_slow_sibling", None)
