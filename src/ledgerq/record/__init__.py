"""Record: what the pipeline writes, and the one verb that writes it.

* :mod:`ledgerq.record.writes` — every pipeline event (a submission's
  outcome, a ledger status, a take) as a :class:`~ledgerq.model.BatchWrite`:
  the seed's state machine in one table;
* :mod:`ledgerq.record.completer` — applies those writes, group-committed,
  each batch's in the order they were made, fenced under high availability.

May import: the foundation and ``ledgers.base`` (the ledger's result and
status types). It reaches the store through a protocol only.
"""
