"""ModalRuntime: one Modal Sandbox per rollout key (the ``modal`` SDK, imported lazily).

The sandbox runs the env image's entry point (``rollouts-env`` from docker/env.Dockerfile, which
serves ``$ROLLOUTS_ENV_FILE`` on ``0.0.0.0:$ROLLOUTS_ENV_PORT``) with ``unencrypted_ports=[port]``;
the endpoint is the TCP tunnel ``sandbox.tunnels()[port].tcp_socket``, reachable from anywhere
(locality ``global``) and therefore always protected by the rollout key's derived token
(``sdk.tokens``), passed in the sandbox environment only: neither the tags nor the Endpoint carry
it, every later step derives it again (workers on several hosts need the same
``ROLLOUTS_TOKEN_SECRET``). Sandboxes are tagged with the rollout key, so a retried acquire finds
and reuses its own running sandbox instead of creating a second. The sandbox timeout is the run
timeout plus a margin, so Modal itself removes a forgotten sandbox; ``release`` terminates it.

The image is a published name (``image_name``, as HUD writes it) or, as in HUD, a
``modal.Image`` object (``image=``). The object cannot travel in the provider's spec: workers in
this process use it (a process-local handle); workers elsewhere get it by id when it was built
already (``image.build(app)``: the spec then carries its ``object_id``), else one ConfigError.

Imports models, errors and the provider base; ``modal`` only inside methods.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import suppress
from typing import Any, ClassVar

from durable_rollouts.runtimes.labels import LABEL_KEY, owner_labels

from ..client.tokens import derived_params, substrate_token
from ..errors import ConfigError, ProviderError, ReadyTimeoutError
from ..models import Endpoint, ProviderSpec, RuntimeConfig, Task
from ..settings import ENV_PORT_VAR, var
from .base import (
    CONTAINER_FIELDS,
    DurableProvider,
    Locality,
    container_name,
    merge_config,
    probe_ready,
)

__all__ = ["MODAL_IMAGE_ELSEWHERE", "ModalRuntime"]

log = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 600.0
DEFAULT_RUN_TIMEOUT_S = 3600.0
TIMEOUT_MARGIN_S = 600
LOG_TAIL_LINES = 40

MODAL_IMAGE_ELSEWHERE = (
    "ModalRuntime(image=<modal.Image>): the image object exists only in the process that made the "
    "runtime, and this worker is elsewhere; build it first (image.build(app), so workers get it "
    "by id) or publish it and pass image_name=")

_IMAGES: dict[str, Any] = {}  # image handle -> the modal.Image object, in the process that made it


class ModalRuntime(DurableProvider):
    """Run each rollout's environment in a Modal Sandbox.

    Args:
        image_name: a registry image reference (``modal.Image.from_registry``) holding the env,
            e.g. one built from docker/env.Dockerfile and pushed; a task's
            ``runtime_config.image`` overrides it.
        image: a ``modal.Image`` object instead of a name (HUD's form; see the module doc for
            how it reaches workers), or the name itself (this package's earlier form).
        command: the sandbox command (default: the image's ``rollouts-env`` entry point).
        port: the port the env serves on inside the sandbox.
        app_name: the Modal App the sandboxes belong to (created if missing).
        runtime_config: defaults for every task (cpu, memory_mb, gpu count, limits).
        env_vars: extra sandbox environment (never task data).
        gpu_type: the GPU type requested when ``resources.gpu`` names none (a task's
            ``RuntimeGPU(type=...)`` wins; Modal takes one type, not a list of choices).
        max_provisions_per_s, max_substrates: fleet-wide admission of new substrates, held
            by Temporal across every worker of the task queue (``DurableProvider.admit``).
    """

    kind: ClassVar[str] = "modal"
    locality: ClassVar[Locality] = "global"
    honours: ClassVar[frozenset[str]] = CONTAINER_FIELDS | {"resources.gpu.type"}

    def __init__(
        self,
        image_name: str | None = None,
        *,
        image: Any = None,
        command: list[str] | None = None,
        port: int = 8765,
        app_name: str = "durable-rollouts",
        runtime_config: RuntimeConfig | dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        gpu_type: str = "any",
        max_provisions_per_s: float | None = None,
        max_substrates: int | None = None,
        image_handle: str | None = None,
        image_id: str | None = None,
    ) -> None:
        self.admit(max_provisions_per_s, max_substrates)
        if image is not None and image_name is not None and image != image_name:
            raise ConfigError("ModalRuntime: give either a published image name (image_name) or "
                              "a modal.Image object (image=), not both")
        if image_name is not None and not isinstance(image_name, str):
            raise ConfigError(f"ModalRuntime(image_name=...) is a published image name, not a "
                              f"{type(image_name).__name__}: pass a modal.Image object as image=")
        self.image: str | None = image if isinstance(image, str) else image_name
        self.image_object: Any = None if isinstance(image, str) else image
        if self.image_object is not None:
            image_handle = image_handle or uuid.uuid4().hex
            _IMAGES.setdefault(image_handle, self.image_object)
        elif image_handle is not None:
            self.image_object = _IMAGES.get(image_handle)
        self.image_handle = image_handle
        self.image_id = image_id
        self.command = list(command) if command else None
        self.port = int(port)
        self.app_name = app_name
        self.runtime_config = (
            RuntimeConfig.model_validate(runtime_config)
            if isinstance(runtime_config, dict)
            else runtime_config
        )
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.gpu_type = gpu_type
        self.check_config(self.runtime_config, what="ModalRuntime(runtime_config=...)")

    def check_config(self, config: RuntimeConfig | None, *, what: str = "task") -> None:
        """The base check, plus: a GPU request names at most one type."""
        super().check_config(config, what=what)
        gpu = config.resources.gpu if config is not None else None
        if gpu is not None and len(gpu.types) > 1:
            raise ConfigError(
                f"ModalRuntime cannot honour a choice of GPU types {gpu.types} of {what}: "
                "a Modal sandbox takes one GPU type"
            )

    def __repr__(self) -> str:
        image = self.image if self.image_handle is None else "<modal.Image>"
        return f"ModalRuntime({image!r}, app_name={self.app_name!r})"

    def _built_image_id(self) -> str | None:
        """The Modal id of the image object, once built (an unbuilt one has none)."""
        if self.image_id is None and self.image_object is not None:
            found = getattr(self.image_object, "object_id", None)  # AttributeError until built
            self.image_id = found if isinstance(found, str) else None
        return self.image_id

    def spec(self) -> ProviderSpec:
        options: dict[str, Any] = {
            "image": self.image,
            "port": self.port,
            "app_name": self.app_name,
        }
        if self.image_handle is not None:
            options["image_handle"] = self.image_handle
        if self._built_image_id() is not None:
            options["image_id"] = self.image_id
        if self.command:
            options["command"] = list(self.command)
        if self.env_vars:
            options["env_vars"] = dict(self.env_vars)
        if self.gpu_type != "any":
            options["gpu_type"] = self.gpu_type
        if self.runtime_config is not None:
            options["runtime_config"] = self.runtime_config.model_dump(
                mode="json", exclude_none=True
            )
        return ProviderSpec(kind=self.kind, options=options)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ModalRuntime:
        opts = dict(options)
        return cls(opts.pop("image", None), **opts)  # the name; the object by image_handle

    # -- modal SDK ------------------------------------------------------------------------------

    @staticmethod
    def _modal() -> Any:
        try:
            import modal
        except ImportError as exc:  # pragma: no cover - modal is a dependency
            raise ConfigError("ModalRuntime needs the 'modal' package") from exc
        return modal

    async def _app(self, modal: Any) -> Any:
        try:
            return await modal.App.lookup.aio(self.app_name, create_if_missing=True)
        except modal.exception.AuthError as exc:
            raise ConfigError(f"Modal rejected the credentials: {exc}") from exc

    async def _find(self, modal: Any, app: Any, key: str) -> Any | None:
        """This key's running sandbox, if any (finished ones are ignored)."""
        found = None
        async for sb in modal.Sandbox.list.aio(app_id=app.app_id, tags={LABEL_KEY: key}):
            if found is None and await sb.poll.aio() is None:
                found = sb
        return found

    # -- contract -----------------------------------------------------------------------------

    async def acquire(self, task: Task, key: str) -> Endpoint:
        """Create (or find) the sandbox for ``key`` and wait until its env answers ``hello``."""
        self.check_task(task)
        config = merge_config(self.runtime_config, task.runtime_config)
        startup = config.limits.startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S
        modal = self._modal()
        app = await self._app(modal)
        sb = await self._find(modal, app, key)
        reused = sb is not None
        if sb is None:
            sb = await self._create(modal, app, task, key, config)
        try:
            tunnels = await sb.tunnels.aio(timeout=int(startup))
            if self.port not in tunnels:
                raise ProviderError(f"sandbox {sb.object_id} has no tunnel for port {self.port}")
            host, port = tunnels[self.port].tcp_socket
            url = f"tcp://{host}:{port}"
            await self._wait_ready(sb, url, substrate_token(key), startup)
        except BaseException:
            with suppress(Exception):
                await asyncio.shield(sb.terminate.aio())
            raise
        log.info(
            "%s sandbox %s for %s at %s", "reusing" if reused else "created", sb.object_id, key, url
        )
        return Endpoint(
            url=url,
            params=derived_params(ready_timeout=startup),
            config=config,
            provider=self.spec(),
            key=key,
            handle={"sandbox_id": sb.object_id, "app_name": self.app_name},
        )

    async def _create(
        self, modal: Any, app: Any, task: Task, key: str, config: RuntimeConfig
    ) -> Any:
        image = self._image(modal, config)
        run_timeout = config.limits.run_timeout_s or DEFAULT_RUN_TIMEOUT_S
        tags = {
            k: v
            for k, v in owner_labels(key, slug=task.slug, run_timeout_s=run_timeout).items()
            if v
        }
        env = dict(self.env_vars)
        env.update(
            {var("env_token"): substrate_token(key), ENV_PORT_VAR: str(self.port)}
        )
        kwargs: dict[str, Any] = {}
        res = config.resources
        if res.cpu is not None:
            kwargs["cpu"] = res.cpu
        if res.memory_mb is not None:
            kwargs["memory"] = res.memory_mb
        if res.gpu is not None:
            kwargs["gpu"] = f"{(res.gpu.types or [self.gpu_type])[0]}:{res.gpu.count}"
        command = self.command or ["rollouts-env"]
        try:
            return await modal.Sandbox.create.aio(
                *command,
                app=app,
                name=container_name(key),
                tags=tags,
                image=image,
                env=env,
                timeout=int(run_timeout) + TIMEOUT_MARGIN_S,
                unencrypted_ports=[self.port],
                **kwargs,
            )
        except modal.exception.AlreadyExistsError:
            # A concurrent acquire of the same key created it first: use that one.
            found = await self._find(modal, app, key)
            if found is None:
                raise
            return found

    def _image(self, modal: Any, config: RuntimeConfig) -> Any:
        """The sandbox's image: the merged ``runtime_config.image`` name, else the image object
        (here, or by its id), else ``image_name``."""
        if config.image and config.image != self.image:
            return modal.Image.from_registry(config.image)
        if self.image_object is not None:
            return self.image_object
        if self._built_image_id() is not None:
            return modal.Image.from_id(self.image_id)
        if self.image:
            return modal.Image.from_registry(self.image)
        if self.image_handle is not None:
            raise ConfigError(MODAL_IMAGE_ELSEWHERE)
        raise ConfigError("ModalRuntime needs an image (ModalRuntime(image_name), "
                          "image=modal.Image, or runtime_config.image)")

    async def _logs(self, sb: Any) -> str:
        out = []
        for stream in (sb.stdout, sb.stderr):
            with suppress(Exception):
                out.append(await asyncio.wait_for(stream.read.aio(), 5))
        lines = "".join(out).splitlines()[-LOG_TAIL_LINES:]
        return "\n".join(lines) or "(no output)"

    async def _wait_ready(self, sb: Any, url: str, token: str, timeout: float) -> None:
        async def died() -> str | None:
            code = await sb.poll.aio()
            if code is None:
                return None
            return (
                f"sandbox {sb.object_id} exited with code {code} before its env "
                f"was ready; last {LOG_TAIL_LINES} log lines:\n{await self._logs(sb)}"
            )

        async def timed_out(exc: ReadyTimeoutError) -> str:
            return (
                f"sandbox {sb.object_id} did not answer within {timeout:g}s "
                f"({exc}); last log lines:\n{await self._logs(sb)}"
            )

        await probe_ready(url, token, timeout, died=died, timed_out=timed_out, poll_s=0.5)

    async def release(self, endpoint: Endpoint) -> None:
        """Terminate the sandbox (a no-op when it is already gone)."""
        modal = self._modal()
        sandbox_id = endpoint.handle.get("sandbox_id")
        targets = []
        if sandbox_id:
            try:
                targets.append(await modal.Sandbox.from_id.aio(sandbox_id))
            except modal.exception.NotFoundError:
                return
        else:
            app = await self._app(modal)
            targets = [
                sb
                async for sb in modal.Sandbox.list.aio(
                    app_id=app.app_id, tags={LABEL_KEY: endpoint.key}
                )
            ]
        for sb in targets:
            with suppress(modal.exception.NotFoundError):
                await sb.terminate.aio()
