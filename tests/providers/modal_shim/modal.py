"""``import modal`` in a worker process with this folder on its PYTHONPATH: the shared stand-in.

The worker stays the product worker (``python -m durable_rollouts.worker``); only its ``modal``
module is ``fake_modal.FakeModal($FAKE_MODAL_DIR, shared=True)``.
"""

import os
import sys
from pathlib import Path

from fake_modal import FakeModal

sys.modules[__name__] = FakeModal(Path(os.environ["FAKE_MODAL_DIR"]), shared=True)
