"""Ingest: the gateway's client-facing REST API (Grid's batch API).

``POST /batches?service_id=`` decodes and verifies a ``BatchList`` and
stores its batches in one transaction; ``GET /batch_statuses``, ``GET
/batches`` and the listings answer from the store. First stage of the data
flow: ingest → store → queue → submit → follow → record.

May import: the foundation (model, errors, clock), ``codec``, ``store``
(its role protocols), ``claims`` (read-only views). Never the later stages.
"""
