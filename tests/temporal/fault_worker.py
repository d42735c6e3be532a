"""Test-only worker entry: the product worker (``durable_rollouts.worker``) with faults armed.

``python -m fault_worker`` takes the same arguments as ``python -m durable_rollouts.worker`` and
builds the same worker, plus :class:`faults.FaultInterceptor` (``ROLLOUTS_FAULTS`` /
``ROLLOUTS_FAULTS_DIR`` say which points fire).
"""

from __future__ import annotations

from faults import FaultInterceptor, arm_checkpoint_faults

from durable_rollouts.worker import main

if __name__ == "__main__":
    arm_checkpoint_faults()
    main(interceptors=[FaultInterceptor()])
