"""The client side of Temporal: connection, data converter and codec, the embedded dev server, jobs.

``connection`` (connect, the embedded dev server), ``codec`` (data converter + payload codec),
``batches`` (start/run/get a batch: what ``Taskset.run`` calls), ``jobs`` (the one reader of a
job's batches and rollouts), ``control`` (list, cancel, wait), ``resume``/``select`` (re-run
chosen rollouts), ``errors`` (Temporal errors as one line), ``plugin`` (``RolloutsPlugin``), ``storage``
(``ROLLOUTS_STORAGE``: temporalio ExternalStorage drivers and claim checks).
Only this package, ``workflows/``, ``activities/`` and ``worker.py`` import temporalio.
"""
