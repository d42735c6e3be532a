"""``python -m durable_rollouts.cli ARGS``: the ``rollouts`` command (the detached worker uses it)."""

from durable_rollouts.cli import main

main()
