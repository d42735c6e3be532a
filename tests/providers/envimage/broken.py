"""An env file that dies while loading: the provider must report its last log lines.

Everything goes to one stream (stderr): the engine copies stdout and stderr separately, so their
relative order in a container's log is not guaranteed.
"""

import sys

for i in range(60):
    print(f"broken-env line {i}", file=sys.stderr, flush=True)
print("broken-env: giving up on purpose", file=sys.stderr, flush=True)
raise SystemExit(3)
