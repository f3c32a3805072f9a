"""The pipeline's owner: the producer, which holds every service's lane.

:class:`~ledgerq.pipeline.producer.Producer` takes batches from the queue
(and with their predecessors' final statuses), has the submitter post them,
the follower follow them, and the completer record every outcome and status.

May import the stages (``queue``, ``submit``, ``follow``, ``record``), the
ledger clients' interface and the foundation; never the store's modules, the
claims, the gateway's wiring or the configuration.
"""
