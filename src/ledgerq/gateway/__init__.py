"""The gateway's wiring: one store, one ledger client and the stages between them.

:mod:`ledgerq.gateway.service` builds the :class:`~ledgerq.gateway.service.Gateway`
(the ingest API and the pipeline's producer around one store);
:mod:`ledgerq.gateway.run` opens what it needs from the settings;
:mod:`ledgerq.gateway.ha` takes claims (PostgreSQL) or the single-instance
lock (SQLite); :mod:`ledgerq.gateway.wakeups` relays wake-ups between
processes over ``LISTEN``/``NOTIFY``.

May import: every stage, ``store``, ``ledgers``, ``claims``, ``operator``,
``config``. Nothing imports it but ``commands``.
"""
