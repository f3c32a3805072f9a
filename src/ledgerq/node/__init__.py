"""The ledger node: the Anoma V1 ordering machine speaking Sawtooth's REST API.

In-process API (what the gateway uses)::

    node = await Node.open(data_dir, shards=4, ephemeral=False,
                           max_pending=100_000, commit_delay_ms=0)
    await node.submit(batches)          # Sequence[ParsedBatch]; NodeBusyError when full
    infos = await node.batch_statuses(ids, wait=5.0)   # dict[id, BatchStatusInfo]
    async for event in node.subscribe(after=None): ...  # StatusEvent(seq, info)
    value = await node.get_state(address)               # bytes | None
    await node.close()

Semantics a caller relies on:

* ``submit`` returns once the batches are in the write-ahead journal (fsync,
  group commit) and queued for ordering; nothing is acknowledged before it is
  durable. Batches already pending or final are disregarded.
* Each batch is one transaction candidate, executed atomically; batches
  commit in the order the node accepted them (fingerprint order), each
  ``commit_delay_ms`` after it executed (0 by default; fault tests raise it to
  catch batches while PENDING).
* Statuses: ``COMMITTED``, ``INVALID`` (with ``invalid_transactions``),
  ``PENDING``, ``UNKNOWN``. ``batch_statuses(wait=s)`` returns, as
  Sawtooth's ``wait``, once no requested batch is ``PENDING`` or after ``s``
  seconds; waiting costs a future per pending batch (``max_waiters``
  node-wide) and nothing else.
* ``subscribe`` yields one :class:`StatusEvent` per batch reaching a final
  status, numbered 1, 2, 3, ... across restarts; ``after`` resumes.
* Durability: after ``kill -9`` and restart the state and the final statuses
  are the same and nothing is applied twice: the on-disk store
  (:mod:`~ledgerq.node.disk`, LMDB) holds what committed up to a journal
  record, and the journal after it is re-executed deterministically.
  ``ephemeral=True`` journals batches only when they commit: pending batches
  are forgotten on restart and report ``UNKNOWN``, as a Sawtooth validator
  does. ``data_dir=None`` keeps nothing at all.
* Memory holds what is pending and bounded windows (the worker's orderings,
  recent events and blocks, commits not yet written); history is on disk.

``make_app(node)`` (``ledgerq.node.rest``) serves the REST API; see
``docs/node.md``.

Layout: :mod:`ledgerq.node.ordering` (the V1 engines), ``families/``
(transaction families), :mod:`~ledgerq.node.candidates` (a Sawtooth batch
as a transaction candidate), :mod:`~ledgerq.node.commit` (the commit
stage), :mod:`~ledgerq.node.journal`, :mod:`~ledgerq.node.disk` (the
on-disk store), :mod:`~ledgerq.node.committed` (store plus unwritten
commits), :mod:`~ledgerq.node.datadir` (the directory lock),
:mod:`~ledgerq.node.node` (the running :class:`Node`), :mod:`~ledgerq.node.rest` with
:mod:`~ledgerq.node.chain_rest` and :mod:`~ledgerq.node.listing` (Sawtooth's
paging and links), :mod:`~ledgerq.node.subscriptions`,
:mod:`~ledgerq.node.scabbard`, :mod:`~ledgerq.node.access` and
:mod:`~ledgerq.node.decoding` (HTTP).

May import: the foundation (errors, clock, failpoints), ``codec`` and ``lmdb``. The node stands
alone: nothing of the gateway (store, stages, claims, ledgers, operator).
"""

from ledgerq.node.commit import BatchStatusInfo, StatusEvent
from ledgerq.node.node import Node
from ledgerq.node.ordering.messages import TxFingerprint

__all__ = ["BatchStatusInfo", "Node", "StatusEvent", "TxFingerprint"]
