"""Deprecated: ``durable_rollouts.codec`` moved to ``durable_rollouts.temporal.codec``.

This alias keeps the old import path working (scripts, benchmarks and saved specs use it); it
is the same module object, so every name, private or public, and monkeypatching behave as
before. New code imports ``durable_rollouts.temporal.codec``.
"""

import sys

from durable_rollouts.temporal import codec as _moved

sys.modules[__name__] = _moved
