"""Submit: POST the queue's batches to the ledger, with retries and a delay window.

May import: the foundation, ``ledgers`` (the client interface and results),
``record`` (every outcome is written through the recorder). Never the store.
"""
