"""Ledgers for testing and benchmarking the gateway against something that is not ours.

* :mod:`ledgerq.testing.fault_ledger` — a Sawtooth-shaped REST ledger over
  real HTTP (``POST /batches``, ``GET``/``POST /batch_statuses?wait=``; no
  ``/events``, no ``/subscriptions``) that commits after a delay, *judges*
  what it receives (a POST of a batch it holds is a violation; intkey
  semantics show any reorder) and injects the faults real ledgers show.
  Run it as ``python -m ledgerq.testing.fault_ledger``.
* :mod:`ledgerq.testing.intkey` — the IntegerKey rules it executes, and the
  per-key commit order it records.

May import: the foundation and ``codec``. Never the gateway's stages, the
store or the node: it stands for a ledger ledgerq does not control.
"""
