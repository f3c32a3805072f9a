"""Submit: POST one batch to the ledger, with retries, and return its outcome.

May import: the foundation and ``ledgers`` (the client interface and
results). It writes nothing: the producer records the outcome.
"""
