"""Queue: which stored batch of which service goes to the ledger next.

* :mod:`ledgerq.queue.serial` — the one-round serial queuer's rules
  (:func:`~ledgerq.queue.serial.select_round`, the reference the store's
  set-based rounds are tested against) and the store role it needs;
* :mod:`ledgerq.queue.parallel` — the per-key parallel rules, likewise;
* :mod:`ledgerq.queue.source` — the queue the producer pulls from: rounds,
  wake-ups, never the same batch twice;
* :mod:`ledgerq.queue.ahead` — a serial service's next batch, read ahead.

May import: the foundation (model, errors, clock). ``serial`` is pure rules
over :mod:`ledgerq.model`, so the store may import it; ``source`` talks to
the store only through protocols.
"""
