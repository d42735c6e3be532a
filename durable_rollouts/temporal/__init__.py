"""The client side of Temporal: connection, data converter and codec, the embedded dev server, jobs.

Only this package, ``workflows/``, ``activities/`` and ``worker.py`` import temporalio.
"""
