"""Tell the sdk which workflow and Temporal server each activity runs for.

:class:`OwnerInterceptor` sets ``sdk.labels.current_owner`` to (workflow id, ``<server>/<namespace>``)
for the duration of every activity, so substrates placed by a step carry owner labels that
``rollouts gc`` can check against Temporal, while ``sdk/`` never imports temporalio.
"""

from __future__ import annotations

import contextlib
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from durable_rollouts.runtimes.labels import current_owner, server_id

__all__ = ["OwnerInterceptor"]


class _OwnerInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        server = ""
        with contextlib.suppress(Exception):  # no client in this activity: the label stays empty
            server = server_id(activity.client())
        token = current_owner.set((activity.info().workflow_id or "", server))
        try:
            return await self.next.execute_activity(input)
        finally:
            current_owner.reset(token)


class OwnerInterceptor(Interceptor):
    """The worker interceptor that sets ``current_owner`` around every activity."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _OwnerInbound(next)
