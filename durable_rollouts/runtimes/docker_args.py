"""``docker run`` arguments, as HUD's ``DockerRuntime(run_args=(...))`` takes them, turned into
the Docker SDK's ``containers.run`` keywords that ``DockerRuntime`` passes on.

Only flags with a plain keyword counterpart are translated; any other flag is one clear error
naming it (``--gpus``: use ``RuntimeConfig.resources.gpu``). ``-e``/``--env`` go to the
runtime's environment variables. Flags that map to a keyword ``DockerRuntime`` forbids
(``--privileged``, ``--cap-add``, ``--name`` ...) are translated and then refused by it. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["parse_run_args"]

_VALUES = {  # flag -> (keyword, how its value is read)
    "--shm-size": ("shm_size", "str"), "--user": ("user", "str"), "-u": ("user", "str"),
    "--workdir": ("working_dir", "str"), "-w": ("working_dir", "str"),
    "--memory": ("mem_limit", "str"), "-m": ("mem_limit", "str"), "--cpus": ("nano_cpus", "cpus"),
    "--pids-limit": ("pids_limit", "int"), "--network": ("network", "str"),
    "--hostname": ("hostname", "str"), "-h": ("hostname", "str"),
    "--entrypoint": ("entrypoint", "str"), "--ipc": ("ipc_mode", "str"),
    "--runtime": ("runtime", "str"), "--platform": ("platform", "str"),
    "--name": ("name", "str"), "--label": ("labels", "pair="), "-l": ("labels", "pair="),
    "--cap-add": ("cap_add", "list"), "--cap-drop": ("cap_drop", "list"),
    "--device": ("devices", "list"), "--security-opt": ("security_opt", "list"),
    "--dns": ("dns", "list"), "--group-add": ("group_add", "list"),
    "--add-host": ("extra_hosts", "pair:"), "--sysctl": ("sysctls", "pair="),
    "--tmpfs": ("tmpfs", "tmpfs"), "--volume": ("volumes", "volume"), "-v": ("volumes", "volume"),
    "--env": ("environment", "pair="), "-e": ("environment", "pair="),
    "--publish": ("ports", "str"), "-p": ("ports", "str"),
}
_SWITCHES = {"--read-only": "read_only", "--init": "init", "--privileged": "privileged",
             "--rm": "auto_remove", "-t": "tty", "--tty": "tty", "-i": "stdin_open",
             "--interactive": "stdin_open", "-P": "publish_all_ports", "-d": "detach",
             "--detach": "detach"}


def parse_run_args(args: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``("--shm-size=2g", "-e", "K=V", ...)`` -> (``containers.run`` keywords, env vars).

    Raises:
        ConfigError: a flag without a translation, or one missing its value.
    """
    kwargs: dict[str, Any] = {}
    items = [str(a) for a in args]
    i = 0
    while i < len(items):
        flag, value = items[i], None
        if flag.startswith("--") and "=" in flag:
            flag, value = flag.split("=", 1)
        i += 1
        if flag in _SWITCHES:
            kwargs[_SWITCHES[flag]] = True
            continue
        if flag not in _VALUES:
            hint = " (use RuntimeConfig.resources.gpu)" if flag == "--gpus" else ""
            raise ConfigError(f"DockerRuntime run_args: {flag!r} has no translation to the "
                              f"Docker SDK{hint}; pass run_args as a dict of containers.run keywords")
        if value is None:
            if i >= len(items):
                raise ConfigError(f"DockerRuntime run_args: {flag!r} needs a value")
            value, i = items[i], i + 1
        _add(kwargs, *_VALUES[flag], value, flag)
    env = kwargs.pop("environment", {})
    return kwargs, env


def _add(kwargs: dict[str, Any], key: str, how: str, value: str, flag: str) -> None:
    if how == "str":
        kwargs[key] = value
    elif how == "int":
        kwargs[key] = _number(int, value, flag)
    elif how == "cpus":
        kwargs[key] = int(_number(float, value, flag) * 1e9)
    elif how == "list":
        kwargs.setdefault(key, []).append(value)
    elif how in ("pair=", "pair:"):
        name, sep, rest = value.partition(how[-1])
        if not sep:
            raise ConfigError(f"DockerRuntime run_args: {flag} {value!r}: expected NAME{how[-1]}VALUE")
        kwargs.setdefault(key, {})[name] = rest
    elif how == "tmpfs":
        path, _, options = value.partition(":")
        kwargs.setdefault(key, {})[path] = options
    else:  # volume: SRC:DST[:ro|rw]
        parts = value.split(":")
        if len(parts) not in (2, 3):
            raise ConfigError(f"DockerRuntime run_args: {flag} {value!r}: expected SRC:DST[:ro|rw]")
        mode = parts[2] if len(parts) == 3 else "rw"
        kwargs.setdefault(key, {})[parts[0]] = {"bind": parts[1], "mode": mode}


def _number(kind: type, value: str, flag: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"DockerRuntime run_args: {flag} {value!r} is not a number") from None
