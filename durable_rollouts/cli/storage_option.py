"""``--storage URL`` on every command that connects to Temporal (every one that has ``--temporal``).

The option sets ``ROLLOUTS_STORAGE`` for this process (and its children) before the command body
runs, so the one data converter (``temporal.codec``) and the store probe pick it up. A malformed
URL is a usage error: one ``error:`` line, exit code 2.
"""

from __future__ import annotations

import os
from typing import Any

import typer

from durable_rollouts.errors import ConfigError

__all__ = ["add_storage_option"]


def _use_storage(ctx: Any, param: Any, value: str | None) -> None:
    if value:
        from durable_rollouts.temporal.storage import STORAGE_ENV, parse_storage_url

        try:
            parse_storage_url(value)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
        os.environ[STORAGE_ENV] = value


def add_storage_option(group: Any) -> None:
    """Give every command of ``group`` that has ``--temporal`` a ``--storage URL`` too."""
    from typer.core import TyperOption

    for command in getattr(group, "commands", {}).values():
        add_storage_option(command)
        params = {p.name: p for p in command.params}
        if "temporal" in params and "storage" not in params:
            command.params.append(TyperOption(  # an optional string, like --temporal
                param_decls=["--storage"], type_descriptor=params["temporal"].type_descriptor,
                expose_value=False, callback=_use_storage, is_eager=True,
                help="where state outside Temporal lives: file://PATH, s3://BUCKET/PREFIX or "
                     "gs://BUCKET/PREFIX (default: $ROLLOUTS_STORAGE, else "
                     "file://$ROLLOUTS_HOME/storage)"))
