"""Every ``ROLLOUTS_*`` environment variable the package reads, as one typed object.

``settings()`` returns a :class:`Settings` for the environment as it is *now*: values are read when
they are needed, so a variable set after import (a test's ``monkeypatch.setenv``, ``--storage``
setting ``ROLLOUTS_STORAGE`` for this process and its children) takes effect at once. The parsed
object is cached per distinct set of values, so a call costs a few dict lookups. An empty value
counts as unset. A bad value is a ``ConfigError`` naming the variable, whichever setting the caller
wanted: the environment is checked as a whole.

Some ``ROLLOUTS_*`` names are not settings but agreements between processes; they are the
constants at the end (:data:`PROCESS_NAMES`). The README's "Settings" table is
:func:`markdown_table`; ``tests/test_settings.py`` fails when the two differ. Imports only pydantic
and ``errors``, so every layer (the env server included) can use it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from .errors import ConfigError

__all__ = [
    "AGENT_HEARTBEAT_UNWATCHED_S",
    "AGENT_HEARTBEAT_WATCHED_S",
    "ENV_FILE_VAR",
    "ENV_PORT_VAR",
    "MAX_CHILDREN_PER_WORKFLOW",
    "PROCESS_NAMES",
    "RUN_TIMEOUT_VAR",
    "SERVE_PORT_VAR",
    "WORKER_READY",
    "Settings",
    "markdown_table",
    "settings",
    "var",
]


AGENT_HEARTBEAT_WATCHED_S = 300.0
"""The agent step's heartbeat timeout by default while the worker watch is on (a backstop)."""
AGENT_HEARTBEAT_UNWATCHED_S = 20.0
"""... and with it off: a dead worker's agent step is retried within it."""

MAX_CHILDREN_PER_WORKFLOW = 1900
"""The most ``ROLLOUTS_CHILDREN_PER_WORKFLOW`` may be (Temporal: 2,000 pending children per workflow)."""


def _var(name: str, default: Any, description: str, *, shown: str | None = None,
          **constraints: Any) -> Any:
    """A field read from ``name``; ``shown`` is the default as the README states it."""
    return Field(default, alias=name, description=description,
                 json_schema_extra={"shown": shown} if shown else None, **constraints)


class Settings(BaseModel):
    """The ``ROLLOUTS_*`` settings (field alias = variable name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path | None = _var(
        "ROLLOUTS_HOME", None, "State directory: the embedded Temporal server's sqlite file, "
        "subprocess substrates, traces, file storage, the token secret.",
        shown="`~/.local/share/durable-rollouts`")
    temporal_address: str | None = _var(
        "ROLLOUTS_TEMPORAL_ADDRESS", None, "Temporal `HOST:PORT` (`--temporal` overrides); "
        "unset: the embedded dev server, started on demand.")
    temporal_ui: str | None = _var(
        "ROLLOUTS_TEMPORAL_UI", None, "Web UI base URL for the job links `rollouts` prints; "
        "unset: the embedded server's UI when that server is the one used.")
    task_queue: str = _var(
        "ROLLOUTS_TASK_QUEUE", "rollouts", "Shared task queue of batches and workers "
        "(`--task-queue` overrides). Unset, a process running its own in-process worker puts "
        "each job on a queue of its own, `rollouts-job-<job id>`; set, that process shares this "
        "queue with `rollouts worker`s.")
    storage: str | None = _var(
        "ROLLOUTS_STORAGE", None, "Store of large payloads and traces, shared by the client and "
        "every worker: `file://PATH`, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX` (`--storage` "
        "overrides).", shown="`file://$ROLLOUTS_HOME/storage`")
    storage_threshold: int = _var(
        "ROLLOUTS_STORAGE_THRESHOLD", 256 * 1024, "Payloads over this many bytes (after "
        "encryption) go to the store; the workflow history keeps a reference.", ge=0)
    storage_patience: float = _var(
        "ROLLOUTS_STORAGE_PATIENCE", 120.0, "Seconds a trace or claim-check read or write keeps "
        "retrying (with backoff) while an `s3://` or `gs://` store is unreachable, before the "
        "step fails: a store outage shorter than this costs no step attempt.", ge=0)
    payload_key: SecretStr | None = _var(
        "ROLLOUTS_PAYLOAD_KEY", None, "Comma-separated base64 32-byte keys: when set, payloads "
        "are encrypted (AES-256-GCM) with the first key; every key decrypts.")
    token_secret: SecretStr | None = _var(
        "ROLLOUTS_TOKEN_SECRET", None, "Secret the substrate tokens are derived from; workers "
        "on several hosts that share substrates need the same value.",
        shown="`$ROLLOUTS_HOME/token.secret` (created once)")
    env_token: SecretStr | None = _var(
        "ROLLOUTS_ENV_TOKEN", None, "Token an env server requires of its clients (needed to "
        "bind beyond loopback); `--runtime tcp://...` sends it.")
    url: str | None = _var(
        "ROLLOUTS_URL", None, "Env server `tcp://HOST:PORT` of the `rollouts task` commands "
        "(`--url` overrides).")
    ssh_key: Path | None = _var(
        "ROLLOUTS_SSH_KEY", None, "Private key of `--runtime ssh://...` (`?key=` overrides).",
        shown="the first of `~/.ssh/id_ed25519`, `id_ecdsa`, `id_rsa`")
    queue_timeout: float = _var(
        "ROLLOUTS_QUEUE_TIMEOUT", 30.0, "Seconds a rollout step may wait on its substrate's own "
        "(host or process) queue before that queue is probed: a live worker with every slot busy "
        "answers and the step waits again; otherwise the worker, and the substrate, count as gone "
        "and the rollout reprovisions on a live worker (set when a batch starts).", gt=0)
    agent_heartbeat: float | None = _var(
        "ROLLOUTS_AGENT_HEARTBEAT", None, "Heartbeat timeout in seconds of the agent step. With "
        "the worker watch on, a backstop: a dead worker's agent steps are scheduled again when "
        "its watch notices; with it off, within this. Each waiting agent costs the server one "
        "heartbeat per 80% of it, at most one a minute (set when a batch starts).",
        shown=f"{AGENT_HEARTBEAT_WATCHED_S:g} (the worker watch on), else 20", gt=0)
    worker_watch: float = _var(
        "ROLLOUTS_WORKER_WATCH", 10.0, "Seconds a worker process may miss its liveness beats "
        "before it counts as dead: every agent step it ran is then scheduled again at once, "
        "rather than after the step's own heartbeat timeout. One beat per worker process "
        "instead of a fast one per waiting agent; 0 turns the watch off (read when a batch and "
        "when a worker starts).", ge=0)
    children_per_workflow: int = _var(
        "ROLLOUTS_CHILDREN_PER_WORKFLOW", 1000, "Rollouts one batch workflow keeps in flight: a "
        "batch whose `max_concurrent` is wider runs as parts, child batch workflows of at most "
        "this many rollouts each, under Temporal's 2,000 pending children per workflow "
        "(set when a batch starts).", ge=1, le=MAX_CHILDREN_PER_WORKFLOW)
    stream_page_size: int = _var(
        "ROLLOUTS_STREAM_PAGE_SIZE", 128, "Groups per page of a streamed job: groups every "
        "registered consumer acknowledged leave the batch's workflow state for `ROLLOUTS_STORAGE` "
        "in pages of this many (set when a job starts; `Taskset.start(page_size=...)` overrides).",
        ge=1)
    admission_sweep: float = _var(
        "ROLLOUTS_ADMISSION_SWEEP", 60.0, "Seconds between two looks, while rollouts wait on a "
        "runtime's `max_substrates`, for holders that closed without giving their admission "
        "ticket back (a terminated Rollout); each look is one activity (set when a runtime is "
        "made).", gt=0)
    daytona_known_hosts: Path | None = _var(
        "ROLLOUTS_DAYTONA_KNOWN_HOSTS", None, "known_hosts file the Daytona SSH gateway's host "
        "key is checked against; unset, it is not checked (Daytona publishes none).")
    gc_every: float = _var(
        "ROLLOUTS_GC_EVERY", 300.0, "Worker processes remove orphaned substrates every this "
        "many seconds; 0 disables it (`--gc-every` overrides).", ge=0)
    malloc_trim: float = _var(
        "ROLLOUTS_MALLOC_TRIM", 10.0, "A process that runs a worker hands memory glibc's malloc "
        "holds free back to the kernel every this many seconds, with a fixed mmap threshold of "
        "256 KiB, so a long job's worker stays at a flat RSS; 0 leaves malloc as it is (read when "
        "the process's first worker starts; a no-op without glibc).", ge=0)
    sticky_timeout: float = _var(
        "ROLLOUTS_STICKY_TIMEOUT", 10.0, "Seconds a workflow's next task may wait for the worker "
        "that has the workflow cached before another worker (or the same one) takes it with a "
        "replay of the whole history; a busy worker that answers late is cheaper than a replay "
        "of a long batch run (set when a worker starts).", gt=0)
    workspace_isolation: Literal["auto", "bwrap", "none"] = _var(
        "ROLLOUTS_WORKSPACE_ISOLATION", "auto", "Sandbox of env workspaces left at "
        "`isolation=\"auto\"`, read by the env server: `auto` runs agent commands in bubblewrap "
        "and refuses them where it cannot sandbox; `none` runs them unsandboxed; `bwrap` fails "
        "the env's start where bubblewrap cannot sandbox.")
    workflow_sandbox: bool = _var(
        "ROLLOUTS_WORKFLOW_SANDBOX", False, "Run workflows in temporalio's sandbox (about 30% "
        "more worker CPU; the workflows import only pure models).")
    sqlite_sync: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = _var(
        "ROLLOUTS_SQLITE_SYNC", "NORMAL", "`synchronous` pragma of the embedded server's sqlite "
        "file: `FULL` also survives an OS crash or power loss.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = _var(
        "ROLLOUTS_LOG_LEVEL", None, "Python log level of worker processes (`INFO`: one line per "
        "removed orphan).", shown="`WARNING` (`python -m durable_rollouts.worker`), none "
        "(`rollouts worker`)")
    release_commit: str | None = _var(
        "ROLLOUTS_RELEASE_COMMIT", None, "Commit named in worker identities and release markers "
        "(for installs without a git checkout).", shown="git of the checkout, else `dev`")
    cli_soft_exit: bool = _var(
        "ROLLOUTS_CLI_SOFT_EXIT", False, "`rollouts` ends by raising `typer.Exit` instead of "
        "`os._exit` (for calling `cli.main()` in-process).")

    @field_validator("sqlite_sync", "log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @property
    def agent_heartbeat_s(self) -> float:
        """The agent step's heartbeat timeout: the variable, else the default for the watch."""
        if self.agent_heartbeat is not None:
            return self.agent_heartbeat
        return AGENT_HEARTBEAT_WATCHED_S if self.worker_watch > 0 else AGENT_HEARTBEAT_UNWATCHED_S


_NAMES = tuple(field.alias or name for name, field in Settings.model_fields.items())


def var(field: str) -> str:
    """The environment variable of ``Settings.<field>``, e.g. ``var("home") == "ROLLOUTS_HOME"``."""
    return Settings.model_fields[field].alias or field


def settings() -> Settings:
    """The settings as the environment holds them now.

    Raises:
        ConfigError: a variable holds a value of the wrong type or out of range.
    """
    return _parse(tuple(os.environ.get(name) for name in _NAMES))


@functools.lru_cache(maxsize=32)
def _parse(values: tuple[str | None, ...]) -> Settings:
    raw = {name: value for name, value in zip(_NAMES, values, strict=True)
           if value is not None and value.strip()}
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "ROLLOUTS_*"
        shown = "<secret>" if name in _SECRET else repr(raw.get(name))
        raise ConfigError(f"{name}={shown}: {error['msg']}") from None


_SECRET = {var(f) for f, info in Settings.model_fields.items()
           if "SecretStr" in str(info.annotation)}


# -- names between processes, not settings ---------------------------------------------------

SERVE_PORT_VAR = "ROLLOUTS_SERVE_PORT"  # ``protocol.SERVE_PORT_ANNOUNCEMENT`` is ``<this>=``
WORKER_READY = "ROLLOUTS_WORKER_READY"
ENV_PORT_VAR = "ROLLOUTS_ENV_PORT"
ENV_FILE_VAR = "ROLLOUTS_ENV_FILE"
RUN_TIMEOUT_VAR = "ROLLOUTS_RUN_TIMEOUT_S"

PROCESS_NAMES = {
    SERVE_PORT_VAR: "An env server prints `ROLLOUTS_SERVE_PORT=<port>` once it listens; its "
    "launcher (subprocess, SSH) reads the port from it.",
    WORKER_READY: "A worker process prints `ROLLOUTS_WORKER_READY queue=<queue>` once it polls.",
    ENV_PORT_VAR: "Port an env image serves on, set by the Docker and Modal runtimes "
    "(`docker/rollouts-env`).",
    ENV_FILE_VAR: "The `env.py` an env image serves (`docker/rollouts-env`, default "
    "`/app/env.py`).",
    RUN_TIMEOUT_VAR: "Set by the Docker runtime from `limits.run_timeout_s`: the image's entry "
    "point stops the server after that many seconds.",
}


def markdown_table() -> str:
    """The README's settings table, then the table of names between processes."""
    rows = ["| Variable | Default | What it does |", "|---|---|---|"]
    for info in Settings.model_fields.values():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        shown = extra.get("shown") or ("unset" if info.default is None else f"`{info.default}`")
        rows.append(f"| `{info.alias}` | {shown} | {info.description} |")
    rows += ["", "Names between processes (announcements and env-image inputs, not settings):",
             "", "| Name | Meaning |", "|---|---|"]
    rows += [f"| `{name}` | {meaning} |" for name, meaning in PROCESS_NAMES.items()]
    return "\n".join(rows)
