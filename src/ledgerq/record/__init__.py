"""Record: the one writer of batch state on behalf of the pipeline.

The submitter's outcomes and the ledger's statuses become store states here
(the table in :mod:`ledgerq.record.recorder`), fenced under high
availability; a write that frees a service wakes the queue.

May import: the foundation and ``ledgers.base`` (the ledger's status type).
It reaches the store through the :class:`~ledgerq.record.recorder.StatusWriter`
protocol only.
"""
