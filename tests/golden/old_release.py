"""The previous release, installed from this clone's own git history into a second venv.

``PREVIOUS_RELEASE`` (next to this file) names the commit. ``install(commit)`` extracts it with
``git archive`` into a venv whose ``.pth`` file points at the running venv's site-packages (so it
reuses every installed dependency and needs no package index) and installs it the way pip lays
out a pure-Python wheel: the package folder plus a ``.dist-info`` with its version and console
script (pip itself would need ``wheel`` in the venv to build it, which CI's venv lacks). Cached under ``$TMPDIR/durable-rollouts-releases/
<commit>`` (a rerun costs nothing). A commit missing from the clone (a shallow clone) is an error
that says how to fetch it, never a skip.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(tempfile.gettempdir()) / "durable-rollouts-releases"


def repo_root() -> Path:
    out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"the upgrade test needs a git clone of the repository: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def previous_commit() -> str:
    return (HERE / "PREVIOUS_RELEASE").read_text().split()[0]


def _git(repo: Path, *args: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, **kw)  # type: ignore[call-overload]


def resolve(repo: Path, commit: str) -> str:
    """The full hash of ``commit``; AssertionError with the fix when the clone lacks it."""
    out = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", text=True)
    if out.returncode != 0:
        shallow = _git(repo, "rev-parse", "--is-shallow-repository", text=True).stdout.strip()
        raise AssertionError(
            f"previous release {commit} (tests/golden/PREVIOUS_RELEASE) is not in the clone at {repo}"
            + (" (a shallow clone: run `git fetch --unshallow`)" if shallow == "true"
               else " (fetch the full history of main)"))
    return out.stdout.strip()


def install(commit: str | None = None) -> tuple[Path, float]:
    """(python of a venv with the release installed, seconds it took; 0.0 when cached)."""
    repo = repo_root()
    full = resolve(repo, commit or previous_commit())
    home = CACHE / full
    python = home / "venv" / "bin" / "python"
    if (home / "ok").exists() and python.exists():
        return python, 0.0
    t0 = time.monotonic()
    shutil.rmtree(home, ignore_errors=True)
    (home / "src").mkdir(parents=True)
    archive = _git(repo, "archive", "--format=tar", full)
    if archive.returncode != 0:
        raise AssertionError(f"git archive {full} failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(home / "src")], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # plain path lines: the running venv's packages come after the release's own site-packages
    (Path(purelib) / "_current_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _lay_out(home / "src", Path(purelib))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = subprocess.run([str(python), "-c", "import durable_rollouts; print(durable_rollouts.__file__)"],
                           cwd=home, env=env, capture_output=True, text=True, check=True).stdout
    if not check.startswith(purelib):
        raise AssertionError(f"the old venv imports durable_rollouts from {check.strip()}, not {purelib}")
    (home / "ok").write_text(full + "\n")
    return python, time.monotonic() - t0


def _lay_out(src: Path, purelib: Path) -> None:
    """Install the pure-Python package at ``src`` into ``purelib`` (package + dist-info)."""
    project = tomllib.loads((src / "pyproject.toml").read_text())["project"]
    shutil.copytree(src / "durable_rollouts", purelib / "durable_rollouts",
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = purelib / f"durable_rollouts-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    scripts = "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items())
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{scripts}")
    (info / "INSTALLER").write_text("tests/golden/old_release.py\n")
    (info / "RECORD").write_text("")


def old_env(home: Path) -> dict[str, str]:
    """The environment of an old-release process: no PYTHONPATH into the tree under test."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(HERE.parent / "temporal")  # test agents/envs only (no package there)
    return env
