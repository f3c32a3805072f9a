"""The Anoma V1 ordering machine: engines, their messages and the router.

One engine per module, named as in the V1 specification: the mempool
:mod:`~ledgerq.node.ordering.worker`, the :mod:`~ledgerq.node.ordering.shard`
(multi-version key-value timelines with locks), the
:mod:`~ledgerq.node.ordering.executor` and its
:mod:`~ledgerq.node.ordering.supervisor`; :mod:`~ledgerq.node.ordering.messages`
holds the typed messages and :mod:`~ledgerq.node.ordering.machine` the
router that delivers them.

May import: :mod:`ledgerq.clock` only. The engines are synchronous and know
nothing of HTTP, Sawtooth or storage.
"""
