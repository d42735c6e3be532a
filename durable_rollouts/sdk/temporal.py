"""Deprecated: ``durable_rollouts.sdk.temporal`` moved to ``durable_rollouts.temporal.connection``.

This alias keeps the old import path working (scripts, benchmarks and saved specs use it); it
is the same module object, so every name, private or public, and monkeypatching behave as
before. New code imports ``durable_rollouts.temporal.connection``.
"""

import sys

from durable_rollouts.temporal import connection as _moved

sys.modules[__name__] = _moved
