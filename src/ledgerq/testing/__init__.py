"""Ledgers for testing and benchmarking the gateway against something that is not ours.

* :mod:`ledgerq.testing.fault_ledger` — a Sawtooth-shaped REST ledger over
  real HTTP (``POST /batches``, ``GET``/``POST /batch_statuses?wait=``; no
  ``/events``, no ``/subscriptions``) that commits after a delay, *judges*
  what it receives (a POST of a batch it has is a violation; intkey
  semantics show any reorder), treats transactions' ``dependencies`` as a
  Sawtooth validator does (holds, then drops, a batch whose dependencies it
  has not seen) and injects the faults real ledgers show. Run it as
  ``python -m ledgerq.testing.fault_ledger``.
* :mod:`ledgerq.testing.dependencies` — what it knows of transactions to
  judge dependencies: seen, committed, and the batches waiting on them.
* :mod:`ledgerq.testing.intkey_load` — the ``intkey load`` shape: intkey
  batches with cross-batch dependencies (as sawtooth-sdk-python's ``intkey
  create_batch`` makes them) posted out of dependency order by concurrent
  posters, and the judge of a run.
* :mod:`ledgerq.testing.intkey` — the IntegerKey rules it executes, and the
  per-key commit order it records.

May import: the foundation and ``codec``. Never the gateway's stages, the
store or the node: it stands for a ledger ledgerq does not control.
"""
