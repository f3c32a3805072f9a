"""Follow: learn each submitted batch's fate from the ledger until it is final.

* :mod:`ledgerq.follow.follower` — every batch followed on its own: parked
  ``wait`` reads, asks, events and triggers as accelerators;
* :mod:`ledgerq.follow.in_flight` — which batches to follow, read from the
  store through a protocol.

It writes nothing: each status goes to a sink (the producer).

May import: the foundation and ``ledgers``. Never the store module.
"""
