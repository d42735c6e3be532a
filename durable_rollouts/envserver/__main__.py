"""``python -m durable_rollouts.envserver ENV.py [--env NAME] [--host H] [--port P]``.

Prints ``ROLLOUTS_SERVE_PORT=<port>`` once the hooks ran and the port is bound. Only parses
arguments; the work is in ``entry.run_serve``.
"""

from __future__ import annotations

import argparse
import sys

from .entry import run_serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_rollouts.envserver", description=__doc__)
    parser.add_argument("target", help="env.py path, module or module:attr")
    parser.add_argument("--env", dest="env_name", default=None, help="environment name when several")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--park-ttl-s", type=float, default=3600.0)
    args = parser.parse_args(argv)
    return run_serve(
        args.target, env_name=args.env_name, host=args.host, port=args.port, park_ttl_s=args.park_ttl_s
    )


if __name__ == "__main__":
    sys.exit(main())
