#!/usr/bin/env bash
# The lowest-versions lane: every core dependency at the lower bound pyproject.toml declares, in a
# fresh venv, then a quick subset of the tests. It checks that the declared ranges are honest.
#
#   bash scripts/min_deps.sh            # venv in .venv-min (kept: a second run reuses it)
#   MIN_DEPS_FRESH=1 bash scripts/min_deps.sh   # recreate the venv
#   bash scripts/min_deps.sh tests/sdk  # other pytest arguments instead of the default subset
#
# The constraints (one `name==version` per core dependency: the lowest release on the index that
# [project].dependencies allows) are written to $VENV/constraints.txt. The test tools come from the [test] extra without hud:
# hud pins fastmcp 3.4.10, which the lowest fastmcp we declare is not. Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MIN_DEPS_VENV:-.venv-min}
PYTHON=${PYTHON:-python3}
started=$(date +%s)

if [ -n "${MIN_DEPS_FRESH:-}" ]; then rm -rf "$VENV"; fi
if [ ! -x "$VENV/bin/python" ]; then "$PYTHON" -m venv "$VENV"; fi

"$VENV/bin/python" -m pip install -q --upgrade pip packaging
"$VENV/bin/python" - "$VENV" <<'PY'
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

venv = Path(sys.argv[1])
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]


def lowest(requirement: Requirement) -> str:
    """The lowest release on the index that the requirement allows (a bound like 1.9 may have
    no release of its own: 1.9.1 is then the lowest installable)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", requirement.name],
                         capture_output=True, text=True, check=True).stdout
    listed = re.search(r"Available versions: (.*)", out)
    versions = sorted(Version(v) for v in listed.group(1).split(", ")) if listed else []
    allowed = [v for v in versions if not v.is_prerelease and v in requirement.specifier]
    if not allowed:
        sys.exit(f"no release of {requirement.name} satisfies {requirement.specifier}")
    return str(allowed[0])


lows = []
for text in project["dependencies"]:
    requirement = Requirement(text)
    if not any(spec.operator in (">=", "==", "~=") for spec in requirement.specifier):
        sys.exit(f"no lower bound declared for {requirement.name}")
    lows.append(f"{requirement.name}=={lowest(requirement)}")
(venv / "constraints.txt").write_text("\n".join(lows) + "\n")
tools = [r for r in project["optional-dependencies"]["test"] if Requirement(r).name not in ("hud", project["name"])]
(venv / "test-tools.txt").write_text("\n".join(tools) + "\n")
print("lowest allowed:", " ".join(lows))
PY

"$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" -e . -r "$VENV/test-tools.txt"
"$VENV/bin/python" -m pip check
echo "installed in $(( $(date +%s) - started )) s:"
"$VENV/bin/python" -m pip freeze -q -r "$VENV/constraints.txt" 2>/dev/null | sed -n '/^##/q;p'

if [ $# -eq 0 ]; then
  set -- tests/test_protocol.py tests/test_client.py tests/test_layering.py tests/envserver \
    tests/sdk tests/capabilities tests/test_cli_task.py tests/cli/test_cli_bad_input.py \
    tests/temporal/test_card_steps.py tests/golden/test_replay_golden.py
fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
echo "min-deps lane: $(( $(date +%s) - started )) s in all"
