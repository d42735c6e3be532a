"""Fixtures of the chaos matrix: the Temporal tests' dev server and client, reused (not copied).

``tests/temporal/conftest.py`` is loaded under another module name and its fixtures re-exported.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_TEMPORAL = Path(__file__).resolve().parent.parent / "temporal"

_spec = importlib.util.spec_from_file_location("temporal_conftest", _TEMPORAL / "conftest.py")
assert _spec is not None and _spec.loader is not None
temporal_conftest = importlib.util.module_from_spec(_spec)
sys.modules["temporal_conftest"] = temporal_conftest
_spec.loader.exec_module(temporal_conftest)

client = temporal_conftest.client
dev_server = temporal_conftest.dev_server
