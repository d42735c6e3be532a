"""``python -m durable_rollouts.envserver ENV.py [--env NAME] [--host H] [--port P] [--max-tasks N] ...``.

Also ``--park-ttl-s`` and ``--max-connections``; the two limits bound what clients can make the server hold.

Prints ``ROLLOUTS_SERVE_PORT=<port>`` once the hooks ran and the port is bound. Only parses
arguments; the work is in ``entry.run_serve``.
"""

from __future__ import annotations

import argparse
import sys

from .entry import run_serve
from .server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_TASKS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_rollouts.envserver", description=__doc__)
    parser.add_argument("target", help="env.py path, module or module:attr")
    parser.add_argument("--env", dest="env_name", default=None, help="environment name when several")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--park-ttl-s", type=float, default=3600.0)
    parser.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="connections served at once"
    )
    parser.add_argument(
        "--max-tasks", type=int, default=DEFAULT_MAX_TASKS, help="tasks in progress at once, parked ones included"
    )
    args = parser.parse_args(argv)
    return run_serve(
        args.target,
        env_name=args.env_name,
        host=args.host,
        port=args.port,
        park_ttl_s=args.park_ttl_s,
        max_connections=args.max_connections,
        max_tasks=args.max_tasks,
    )


if __name__ == "__main__":
    sys.exit(main())
