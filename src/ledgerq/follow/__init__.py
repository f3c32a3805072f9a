"""Follow: learn each submitted batch's fate from the ledger until it is final.

* :mod:`ledgerq.follow.follower` — every batch followed on its own: parked
  ``wait`` reads, asks, events and triggers as accelerators;
* :mod:`ledgerq.follow.in_flight` — which batches to follow, read from the
  store through a protocol.

May import: the foundation, ``ledgers``, ``record``. Never the store module.
"""
