"""The card's steps as plain async functions, and the plan both executors walk.

``provision -> connect -> start -> agent -> grade -> [verify] -> teardown``: ``substrate`` holds
the steps on a substrate (provision, connect, start, grade, teardown), ``agent`` the agent step,
``verifier`` the recorded verify, ``plan`` the step list as data (timeouts, attempts), ``walk``
the plan walked in plain asyncio (``run_direct``). The ``Rollout`` workflow maps the same plan
onto activities (``workflows.plan``), each a thin wrapper over these functions
(``activities.rollout``). No Temporal here; this package imports nothing on import, so the
workflow sandbox can load ``steps.plan`` alone.
"""
