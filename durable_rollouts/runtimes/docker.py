"""DockerRuntime: one container per rollout key, through the docker SDK (imported lazily).

The container is named and labelled after the rollout key, so a retried ``acquire`` (a new worker
process after a crash) finds and reuses the running container instead of starting a second one,
and replaces a dead one (or one started under another token secret). The env inside serves on
``0.0.0.0:<port>`` with the rollout key's derived token (``sdk.tokens``; container environment
``ROLLOUTS_ENV_TOKEN``, never in the Endpoint: later steps derive it again); the port is published
on ``127.0.0.1`` with an ephemeral host port, so the endpoint is reachable from this host only
(locality ``host``). Containers run unprivileged: all capabilities dropped, ``no-new-privileges``,
read-only root with a tmpfs ``/tmp``, a pids limit. ``release`` always force-removes the container.
Images come from ``docker/env.Dockerfile`` (see docker/README.md).

Imports models, errors and the provider base; never another provider module or the Temporal
layer (owner labels come from ``durable_rollouts.gc``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from durable_rollouts.runtimes.labels import LABEL_DEADLINE, LABEL_KEY, owner_labels

from ..client.tokens import derived_params, substrate_token
from ..errors import ConfigError, ProviderError, ReadyTimeoutError
from ..models import Endpoint, ProviderSpec, RuntimeConfig, Task
from ..settings import ENV_PORT_VAR, RUN_TIMEOUT_VAR, var
from .base import (
    CONTAINER_FIELDS,
    DurableProvider,
    Locality,
    Substrate,
    container_name,
    merge_config,
    probe_ready,
)
from .docker_args import parse_run_args
from .docker_substrates import force_remove, labelled_containers

__all__ = ["DockerRuntime", "container_name"]

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
DEFAULT_STARTUP_TIMEOUT_S = 60.0
TOKEN_VAR = var("env_token")

# run_args keys that would break the isolation or bookkeeping this provider promises.
_FORBIDDEN_RUN_ARGS = frozenset(
    {
        "privileged",
        "cap_add",
        "name",
        "labels",
        "ports",
        "publish_all_ports",
        "detach",
        "remove",
        "auto_remove",
        "environment",
        "stdin_open",
        "tty",
    }
)
_RESERVED_ENV = frozenset({TOKEN_VAR, ENV_PORT_VAR, RUN_TIMEOUT_VAR})


class DockerRuntime(DurableProvider):
    """Run each rollout's environment in its own container.

    Args:
        image: the env image (built from docker/env.Dockerfile); a task's
            ``runtime_config.image`` overrides it.
        port: the port the env serves on inside the container.
        run_args: extra keyword arguments for ``containers.run`` (e.g. ``{"read_only": False}``
            for images that need a writable root, ``network_mode``, ``volumes``); keys that would
            grant privileges or break the bookkeeping are rejected. A tuple of ``docker run``
            arguments (HUD's form, e.g. ``("--shm-size=2g", "-e", "K=V")``) is translated
            (``docker_args``).
        runtime_config: defaults for every task; a task's own ``runtime_config`` fields win.
        env_vars: extra container environment (never task data: tasks go over the socket).
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).

    Example:
        >>> runtime = DockerRuntime("letters-env", runtime_config=RuntimeConfig(
        ...     resources={"cpu": 1, "memory_mb": 512}))
    """

    kind: ClassVar[str] = "docker"
    locality: ClassVar[Locality] = "host"
    honours: ClassVar[frozenset[str]] = CONTAINER_FIELDS

    def __init__(
        self,
        image: str | None = None,
        *,
        port: int = 8765,
        run_args: dict[str, Any] | Sequence[str] | None = None,
        runtime_config: RuntimeConfig | dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        max_provisions_per_s: float | None = None,
        max_substrates: int | None = None,
    ) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        self.image = image
        self.port = int(port)
        extra_env: dict[str, str] = {}
        if run_args is not None and not isinstance(run_args, dict):  # HUD's docker CLI args
            run_args, extra_env = parse_run_args(run_args)
        self.run_args = dict(run_args or {})
        self.runtime_config = (
            RuntimeConfig.model_validate(runtime_config)
            if isinstance(runtime_config, dict)
            else runtime_config
        )
        self.env_vars = {str(k): str(v) for k, v in {**extra_env, **(env_vars or {})}.items()}
        bad = sorted(set(self.run_args) & _FORBIDDEN_RUN_ARGS)
        if bad:
            raise ConfigError(f"DockerRuntime run_args may not set {', '.join(bad)}")
        reserved = sorted(set(self.env_vars) & _RESERVED_ENV)
        if reserved:
            raise ConfigError(
                f"DockerRuntime env_vars may not set {', '.join(reserved)} (set by the runtime)"
            )
        self.check_config(self.runtime_config, what="DockerRuntime(runtime_config=...)")
        self._client: Any = None
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DockerRuntime({self.image!r}, port={self.port})"

    # -- spec ----------------------------------------------------------------------------------

    def spec(self) -> ProviderSpec:
        options: dict[str, Any] = {"image": self.image, "port": self.port}
        if self.run_args:
            options["run_args"] = dict(self.run_args)
        if self.env_vars:
            options["env_vars"] = dict(self.env_vars)
        if self.runtime_config is not None:
            options["runtime_config"] = self.runtime_config.model_dump(
                mode="json", exclude_none=True
            )
        return ProviderSpec(kind=self.kind, options=options)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> DockerRuntime:
        opts = dict(options)
        return cls(opts.pop("image", None), **opts)

    # -- docker SDK access (blocking; always called in a thread) -------------------------------

    def _docker(self) -> Any:
        with self._client_lock:
            return self._docker_locked()

    def _docker_locked(self) -> Any:
        if self._client is None:
            try:
                from docker.errors import DockerException

                import docker
            except ImportError as exc:  # pragma: no cover - docker is a dependency
                raise ConfigError("DockerRuntime needs the 'docker' package") from exc
            try:
                client = docker.from_env(max_pool_size=64)
                client.ping()
            except DockerException as exc:
                raise ProviderError(f"no Docker engine reachable: {exc}") from exc
            self._client = client
        return self._client

    def _find(self, name: str) -> Any | None:
        from docker.errors import NotFound

        try:
            return self._docker().containers.get(name)
        except NotFound:
            return None

    def _ensure_image(self, image: str) -> None:
        from docker.errors import APIError, ImageNotFound

        client = self._docker()
        try:
            client.images.get(image)
            return
        except ImageNotFound:
            pass
        try:
            client.images.pull(image)
        except (APIError, ImageNotFound) as exc:
            raise ConfigError(
                f"docker image {image!r} is not on this host and could not be pulled ({exc}); "
                "build it with docker/env.Dockerfile (see docker/README.md)"
            ) from exc

    def _create(
        self, name: str, image: str, labels: dict[str, str], config: RuntimeConfig, token: str
    ) -> Any:
        from docker.errors import APIError
        from docker.types import DeviceRequest

        res, limits = config.resources, config.limits
        environment = dict(self.env_vars)
        environment.update({TOKEN_VAR: token, ENV_PORT_VAR: str(self.port)})
        if limits.run_timeout_s:
            environment[RUN_TIMEOUT_VAR] = f"{limits.run_timeout_s:g}"
        kwargs: dict[str, Any] = {
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
            "read_only": True,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,size=256m"},
            "pids_limit": 512,
        }
        kwargs.update(self.run_args)
        if res.cpu is not None:
            kwargs["nano_cpus"] = int(res.cpu * 1e9)
        if res.memory_mb is not None:
            kwargs["mem_limit"] = f"{res.memory_mb}m"
            kwargs["memswap_limit"] = f"{res.memory_mb}m"
        if res.gpu is not None:  # any type: CONTAINER_FIELDS has no resources.gpu.type
            kwargs["device_requests"] = [DeviceRequest(count=res.gpu.count, capabilities=[["gpu"]])]
        try:
            return self._docker().containers.run(
                image,
                detach=True,
                name=name,
                labels=labels,
                environment=environment,
                ports={f"{self.port}/tcp": ("127.0.0.1", None)},
                **kwargs,
            )
        except APIError as exc:
            if exc.status_code == 409:  # a concurrent acquire of the same key won the race;
                for _ in range(50):  # its container is visible by name once created
                    existing = self._find(name)
                    if existing is not None:
                        return existing
                    time.sleep(0.1)
            self._remove(name)  # `run` may have created the container before its start failed
            if "could not select device driver" in str(exc):
                count = res.gpu.count if res.gpu else 0
                raise ConfigError(
                    f"this Docker engine cannot give {name} {count} GPU(s) (no GPU device "
                    f"driver, e.g. the NVIDIA container toolkit): {exc}"
                ) from exc
            raise ProviderError(f"docker could not start {name} from {image!r}: {exc}") from exc

    def _place(self, task: Task, key: str, config: RuntimeConfig, token: str) -> tuple[Any, bool]:
        """The running container for ``key``: reused when alive with ``token``, else (re)created."""
        name = container_name(key)
        container = self._find(name)
        if container is not None:
            if container.labels.get(LABEL_KEY) != key:
                raise ProviderError(f"container {name} belongs to another key; remove it")
            same_token = hmac.compare_digest(_container_env(container).get(TOKEN_VAR, ""), token)
            if same_token and container.status == "running":
                return container, True
            if same_token and container.status == "created":
                container.start()
                container.reload()
                return container, True
            why = f"status {container.status}" if same_token else "another token secret"
            log.info("replacing container %s (%s)", name, why)
            self._remove(name)
        image = config.image or self.image
        if not image:
            raise ConfigError(
                "DockerRuntime needs an image (DockerRuntime(image) or runtime_config.image)"
            )
        self._ensure_image(image)
        labels = owner_labels(key, slug=task.slug, run_timeout_s=config.limits.run_timeout_s)
        labels = {k: v for k, v in labels.items() if v}
        return self._create(name, image, labels, config, token), False

    def _state(self, container: Any) -> tuple[str, int | None, str | None]:
        """(status, exit code, host port) after a reload."""
        from docker.errors import NotFound

        try:
            container.reload()
        except NotFound:
            return "removed", None, None
        state = container.attrs.get("State") or {}
        ports = (container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        bindings = ports.get(f"{self.port}/tcp") or []
        host_port = next((b.get("HostPort") for b in bindings if b.get("HostPort")), None)
        return container.status, state.get("ExitCode"), host_port

    def _logs(self, container: Any) -> str:
        from docker.errors import APIError

        try:
            raw = container.logs(tail=LOG_TAIL_LINES)
        except APIError:
            return "(no logs: container gone)"
        return raw.decode(errors="replace").rstrip() or "(no output)"

    def _remove(self, name_or_id: str) -> None:
        from docker.errors import APIError, NotFound

        try:
            self._docker().containers.get(name_or_id).remove(force=True, v=True)
        except NotFound:
            return
        except APIError as exc:
            if exc.status_code not in (404, 409):  # 409: removal already in progress
                raise ProviderError(f"docker could not remove {name_or_id}: {exc}") from exc

    # -- contract --------------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        """Start (or find) the container for ``key`` and wait until its env answers ``hello``."""
        self.check_task(task)
        config = merge_config(self.runtime_config, task.runtime_config)
        token = substrate_token(key)
        container, reused = await asyncio.to_thread(self._place, task, key, config, token)
        startup = config.limits.startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S
        try:
            status, code, host_port = await asyncio.to_thread(self._state, container)
            for _ in range(100):  # a concurrent acquire of this key may not have started it
                if status != "created" and not (status == "running" and host_port is None):
                    break  # yet, or docker has not filled in the port mapping yet
                await asyncio.sleep(0.1)
                status, code, host_port = await asyncio.to_thread(self._state, container)
            if status != "running" or host_port is None:
                raise ProviderError(await self._died_message(container, status, code))
            url = f"tcp://127.0.0.1:{host_port}"
            await self._wait_ready(container, url, token, startup)
        except BaseException:
            # A container that never became ready is of no use to a retry: remove it now, so a
            # failed provision (which gets no teardown) leaves nothing behind.
            await asyncio.shield(asyncio.to_thread(self._remove, container.id))
            raise
        log.info(
            "%s container %s for %s at %s",
            "reusing" if reused else "started",
            container.name,
            key,
            url,
        )
        handle = {"container": container.name, "id": container.id, "host": socket.gethostname()}
        deadline = container.labels.get(LABEL_DEADLINE)
        if deadline:
            handle["deadline"] = float(deadline)
        return Endpoint(
            url=url,
            params=derived_params(ready_timeout=startup),
            config=config,
            provider=self.spec(),
            key=key,
            handle=handle,
        )

    async def _died_message(self, container: Any, status: str, code: int | None) -> str:
        for _ in range(20):  # let a dying container finish writing its last lines
            if status not in ("running", "created", "restarting"):
                break
            await asyncio.sleep(0.1)
            status, code, _port = await asyncio.to_thread(self._state, container)
        # The engine copies a container's output asynchronously: under load the last lines can
        # arrive just after the exit. Read until two reads agree (at most ~1 s).
        logs = await asyncio.to_thread(self._logs, container)
        for _ in range(5):
            await asyncio.sleep(0.2)
            again = await asyncio.to_thread(self._logs, container)
            if again == logs:
                break
            logs = again
        return (
            f"container {container.name} is {status} (exit code {code}) before its env "
            f"was ready; last {LOG_TAIL_LINES} log lines:\n{logs}"
        )

    async def _wait_ready(
        self, container: Any, url: str, token: str, timeout: float
    ) -> None:
        """``hello`` through the published port, failing fast (with logs) if the container dies."""

        async def died() -> str | None:
            status, code, _port = await asyncio.to_thread(self._state, container)
            return None if status == "running" else await self._died_message(container, status, code)

        async def timed_out(exc: ReadyTimeoutError) -> str:
            logs = await asyncio.to_thread(self._logs, container)
            return (
                f"container {container.name} did not answer within {timeout:g}s ({exc}); "
                f"last {LOG_TAIL_LINES} log lines:\n{logs}"
            )

        await probe_ready(url, token, timeout, died=died, timed_out=timed_out, poll_s=0.25)

    async def release(self, endpoint: Endpoint) -> None:
        """Force-remove the container (a no-op when it is already gone)."""
        target = (
            endpoint.handle.get("id")
            or endpoint.handle.get("container")
            or container_name(endpoint.key)
        )
        await asyncio.to_thread(self._remove, str(target))

    # -- gc --------------------------------------------------------------------------------------

    @classmethod
    def list_substrates(cls) -> list[Substrate]:
        """The containers labelled ``durable-rollouts.key`` on this engine."""
        return labelled_containers()

    @classmethod
    async def reap(cls, substrate: Substrate, confirm: Callable[[], Awaitable[bool]]) -> bool:
        """Force-remove the container once ``confirm()`` agrees (containers have no lock)."""
        if not await confirm():
            return False
        await asyncio.to_thread(force_remove, substrate.handle["id"])
        return True


def _container_env(container: Any) -> dict[str, str]:
    pairs = (container.attrs.get("Config") or {}).get("Env") or []
    return dict(p.split("=", 1) for p in pairs if "=" in p)
