"""Logic behind the ``rollouts`` command: everything the CLI does besides parsing arguments.

``specs`` turns option strings into objects (taskset files, agent and runtime specs); ``jobs``
reads a job's batches and per-rollout results from Temporal, ``control`` lists and cancels jobs;
``select`` picks the rollouts a resume re-runs and ``resume`` starts the re-run; ``render``
formats tables, traces and export records; ``progress`` draws the live progress bar; ``batch``
(run/resume), ``inspect`` (jobs/show/cancel/export/trace) and ``service`` (server/worker/gc) are
the command bodies. ``durable_rollouts.cli`` imports these lazily so
``rollouts --help`` stays fast; nothing here imports the CLI.
"""

from __future__ import annotations

__all__: list[str] = []
