"""Deprecated: ``durable_rollouts.sdk.orchestrate`` moved to ``durable_rollouts.temporal.batches``.

This alias keeps the old import path working (scripts, benchmarks and saved specs use it); it
is the same module object, so every name, private or public, and monkeypatching behave as
before. New code imports ``durable_rollouts.temporal.batches``.
"""

import sys

from durable_rollouts.temporal import batches as _moved

sys.modules[__name__] = _moved
