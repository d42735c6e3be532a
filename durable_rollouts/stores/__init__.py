"""Claim-check stores: bytes named by a URI, and what the product keeps in them.

``blobs`` is the registry of the blob store (local files until the Temporal layer registers the
``ROLLOUTS_STORAGE`` driver), ``tracestore`` the agents' full traces, ``results`` a job's result
chunks and rows, ``grade_receipts`` the grades a host's grade steps received (local files
only). Workflows carry only the references. Below the steps, the sdk and the Temporal
layers, which all read and write here.
"""
