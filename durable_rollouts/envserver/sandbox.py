"""The bubblewrap sandbox policy for workspace commands: mounts, environment, bwrap command line.

:func:`bwrap_argv` builds the command line that runs one command sandboxed:

- only system directories (``/usr``, ``/bin``, ``/lib*``, ``/etc`` ...) are visible, read-only; the
  rest of the host (the environment's own files, graders, hidden tests) is simply not mounted, and
  ``hide`` paths that do lie under a system directory are covered with an empty tmpfs;
- the workspace directory is writable at ``/workspace``; ``/tmp`` is a private tmpfs; ``/`` is
  remounted read-only;
- no network unless ``network=True`` (``--unshare-net``), own pid/ipc/uts/user namespaces,
  ``--die-with-parent``; the command starts from an empty environment plus
  :func:`command_environ`.

Building it only looks at which system directories exist; :func:`bwrap_failure` is the one
function that runs anything (``bwrap ... true``, to see whether bwrap works on this host).
Imports nothing from the rest of the package.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "SANDBOX_CWD",
    "SANDBOX_PATH",
    "Isolation",
    "Mount",
    "bwrap_argv",
    "bwrap_available",
    "bwrap_failure",
    "command_environ",
]

SANDBOX_CWD = "/workspace"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
PROBE_TIMEOUT_S = 10

Isolation = Literal["auto", "bwrap", "none"]


@dataclass(frozen=True, init=False)
class Mount:
    """An extra bind mount inside the sandbox (read-only unless ``writable``).

    ``Mount(source, target, writable=False)``, or HUD's form ``Mount("ro", src=..., dst=...)``
    (kinds ``ro`` and ``rw``/``bind``; HUD's tmpfs, proc, dev and symlink kinds are not here).
    """

    source: str
    target: str
    writable: bool = False

    def __init__(self, source: str, target: str | None = None, writable: bool = False, *,
                 src: str | None = None, dst: str | None = None) -> None:
        if src is not None or dst is not None:  # HUD's Mount(kind, src=, dst=)
            if source not in ("ro", "rw", "bind") or target is not None:
                raise ValueError(f"Mount({source!r}, src=, dst=): only the 'ro', 'rw' and 'bind' "
                                 "kinds are supported")
            source, target, writable = str(src or dst), str(dst or src), source != "ro"
        object.__setattr__(self, "source", str(source))
        object.__setattr__(self, "target", str(source if target is None else target))
        object.__setattr__(self, "writable", bool(writable))

    @classmethod
    def parse(cls, spec: Mount | str | tuple[str, str] | dict[str, Any]) -> Mount:
        """A Mount, ``"SRC:DST[:rw|ro]"``, ``(src, dst)`` or ``{source, target, writable}``."""
        if isinstance(spec, Mount):
            return spec
        if isinstance(spec, dict):
            return cls(**spec)
        if isinstance(spec, tuple):
            return cls(str(spec[0]), str(spec[1]))
        parts = str(spec).split(":")
        if len(parts) == 1:
            return cls(parts[0], parts[0])
        if len(parts) == 3 and parts[2] in ("ro", "rw"):
            return cls(parts[0], parts[1], writable=parts[2] == "rw")
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ValueError(f"bad mount spec {spec!r}: expected SRC[:DST[:ro|rw]]")


def bwrap_available() -> str | None:
    """The path of the ``bwrap`` binary, or None."""
    return shutil.which("bwrap")


def command_environ(requested: dict[str, str], *, home: str, user: str) -> dict[str, str]:
    """The whole environment of a workspace command: a fixed base plus ``requested``.

    Never the server's own environment: it may hold secrets (API keys, tokens). ``requested``
    cannot override PATH or HOME.
    """
    env = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "USER": user, "TERM": "dumb"}
    env.update({k: v for k, v in requested.items() if k not in ("PATH", "HOME")})
    return env


def bwrap_argv(
    command: Sequence[str],
    *,
    root: Path,
    environ: dict[str, str],
    network: bool = False,
    mounts: Iterable[Mount] = (),
    hide: Iterable[Path] = (),
) -> list[str]:
    """The bwrap command line running ``command`` with ``root`` writable at ``/workspace``.

    ``environ`` is the command's whole environment (see :func:`command_environ`); ``mounts`` are
    bound after the system directories; ``hide`` paths under a system directory are covered.
    The binary is the one :func:`bwrap_available` finds on this process's PATH, so the probe
    and the commands run the bwrap that was checked (the commands' own PATH is fixed).
    """
    # No --new-session: the command has no terminal (so no TIOCSTI risk) and must stay in
    # bwrap's process group, so one killpg reaches it even if bwrap dies before the child
    # armed --die-with-parent; whatever leaves the group dies with the pid namespace.
    argv = [bwrap_available() or "bwrap", "--die-with-parent", "--unshare-all"]
    if network:
        argv.append("--share-net")
    argv += ["--unshare-user", "--uid", "1000", "--gid", "1000", "--clearenv"]
    for key, value in environ.items():
        argv += ["--setenv", key, value]
    argv += _system_dir_args()
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += _hide_args(hide)
    for m in mounts:
        argv += ["--bind" if m.writable else "--ro-bind", m.source, m.target]
    argv += ["--bind", str(root), SANDBOX_CWD, "--remount-ro", "/", "--chdir", SANDBOX_CWD]
    return [*argv, "--", *command]


async def bwrap_failure(argv: Sequence[str]) -> str | None:
    """Run a probe command line (e.g. ``bwrap ... true``): None if it exits 0, else why not."""
    probe = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": SANDBOX_PATH},
    )
    try:
        _, err = await asyncio.wait_for(probe.communicate(), PROBE_TIMEOUT_S)
    except TimeoutError:
        probe.kill()
        await probe.wait()
        err = b"probe timed out"
    if probe.returncode == 0:
        return None
    return f"bwrap does not work here: {err.decode(errors='replace').strip()}"


def _system_dir_args() -> list[str]:
    """Bind each existing system directory read-only (re-create it if it is a symlink)."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        p = Path(path)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), path]
        elif p.is_dir():
            args += ["--ro-bind", path, path]
    return args


def _hide_args(hide: Iterable[Path]) -> list[str]:
    """Cover the ``hide`` paths that would be visible: a directory with tmpfs, a file with null."""
    args: list[str] = []
    for hidden in hide:
        if not any(hidden.is_relative_to(d) for d in SYSTEM_DIRS if Path(d).is_dir()):
            continue  # not mounted at all, so already invisible
        if hidden.is_dir():
            args += ["--tmpfs", str(hidden)]
        elif hidden.exists():
            args += ["--ro-bind", "/dev/null", str(hidden)]
    return args
