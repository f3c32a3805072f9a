"""Ingest: the gateway's client-facing REST API (Grid's batch API, Sawtooth's REST API).

``POST /batches?service_id=`` decodes and verifies a ``BatchList`` and
stores its batches in one transaction; ``GET /batch_statuses``, ``GET
/tracking/batches`` and the listings answer from the store; Sawtooth's read
routes (``/state``, ``/blocks``, …) are answered by the ledger
(:mod:`ledgerq.ingest.chain`). First stage of the data
flow: ingest → store → queue → submit → follow → record.

May import: the foundation (model, errors, clock), ``codec``, ``store``
(its role protocols), ``claims`` (read-only views), ``ledgers.chain`` (the
ledger's read handlers). Never the later stages.
"""
