"""The commit stage: turns execution summaries into final batch statuses.

It is the ``issuer`` engine of the ordering machine: it receives every
``TransactionAck`` (in submission order: the router is FIFO for requests)
and every ``ExecutionSummary``. Candidates commit **in fingerprint order**,
each once it has executed and ``commit_delay_ms`` has passed since; a commit
fixes the batch's final status and numbers it with the next event sequence
number; a COMMITTED batch also gets the next block number (one block per
committed batch; an INVALID batch is in no block); its writes go, with the
event, to the node's committed view (:mod:`ledgerq.node.committed`).
Committing in order makes the committed state always equal a serial
execution of a prefix of the submissions, which is what the journal and the
store rely on.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from ledgerq.clock import Clock
from ledgerq.node.ordering.messages import (
    ExecutionSummary,
    InvalidTx,
    KVSDatum,
    KVSKey,
    SendLog,
    TransactionAck,
    TxFingerprint,
    UnknownMessageError,
)

COMMITTED = "COMMITTED"
INVALID = "INVALID"
PENDING = "PENDING"
UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class BatchStatusInfo:
    """A batch's status as Sawtooth's ``/batch_statuses`` reports it."""

    id: str
    status: str
    invalid_transactions: tuple[InvalidTx, ...] = ()

    def to_json(self) -> dict[str, Any]:
        import base64

        return {
            "id": self.id,
            "status": self.status,
            "invalid_transactions": [
                {
                    "id": t.id,
                    "message": t.message,
                    "extended_data": base64.b64encode(t.extended_data).decode(),
                }
                for t in self.invalid_transactions
            ],
        }


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """A batch reached a final status; ``seq`` increases by one per event.

    ``writes``: what the commit applied to the state (empty for an INVALID batch);
    ``fingerprint``: where the worker ordered the batch; ``block``: the number of
    the block holding a COMMITTED batch (0 for an INVALID one: it is in no block).
    """

    seq: int
    info: BatchStatusInfo
    writes: tuple[tuple[KVSKey, KVSDatum], ...] = ()
    fingerprint: TxFingerprint | None = None
    block: int = 0


#: A final status as stored: ``COMMITTED``, or the invalid transactions of an
#: INVALID batch. Plain strings and tuples, not one object per batch, because
#: millions of long-lived objects would make every garbage collection slower.
FinalStatus = str | tuple[InvalidTx, ...]


def final_info(batch_id: str, stored: FinalStatus) -> BatchStatusInfo:
    if isinstance(stored, str):
        return BatchStatusInfo(batch_id, stored)
    return BatchStatusInfo(batch_id, INVALID, stored)


@dataclass(slots=True)
class _Slot:
    seq: int  # submission number (journal record)
    fingerprint: TxFingerprint | None  # None: a disregarded duplicate
    tx_id: str
    summary: ExecutionSummary | None = None
    ready_at: int = 0


class Ledger:
    """Commit stage and final statuses; ``handle`` is its engine inbox."""

    def __init__(
        self,
        *,
        clock: Clock,
        commit_delay_ms: int = 0,
        submissions: int = 0,
        event_seq: int = 0,
        height: int = 0,
    ) -> None:
        self._clock = clock
        self.commit_delay_ms = commit_delay_ms
        self.submissions = submissions  # acknowledged submissions so far
        self.committed = submissions  # submissions whose outcome is committed
        self.event_seq = event_seq
        #: The number of the chain's latest block (0: the genesis block only).
        self.height = height
        #: The fingerprint of the last commit that executed (None: none yet).
        self.last_fingerprint: TxFingerprint | None = None
        self._slots: deque[_Slot] = deque()
        self._by_fp: dict[TxFingerprint, _Slot] = {}
        self._log_requests: dict[TxFingerprint, list[asyncio.Future[SendLog]]] = {}

    def handle(self, msg: Any) -> None:
        kind = type(msg)
        if kind is TransactionAck:
            self.submissions += 1
            slot = _Slot(self.submissions, msg.fingerprint, msg.tx_hash)
            self._slots.append(slot)
            if msg.fingerprint is not None:
                self._by_fp[msg.fingerprint] = slot
        elif kind is ExecutionSummary:
            slot = self._by_fp.pop(msg.fingerprint)
            slot.summary = msg
            slot.ready_at = self._clock() + self.commit_delay_ms
        elif kind is SendLog:
            for fut in self._log_requests.pop(msg.fingerprint, ()):
                if not fut.done():
                    fut.set_result(msg)
        else:
            raise UnknownMessageError(self, msg)

    def expect_log(self, fingerprint: TxFingerprint) -> asyncio.Future[SendLog]:
        """A future for the ``SendLog`` answering a ``RequestLogs`` about to be sent."""
        fut: asyncio.Future[SendLog] = asyncio.get_running_loop().create_future()
        self._log_requests.setdefault(fingerprint, []).append(fut)
        return fut

    @property
    def uncommitted(self) -> int:
        return len(self._slots)

    def take_ready(self, now: int) -> tuple[list[_Slot], int | None]:
        """Pop the in-order prefix ready to commit; also when the next one will be."""
        ready: list[_Slot] = []
        slots = self._slots
        while slots:
            slot = slots[0]
            if slot.fingerprint is not None:
                if slot.summary is None:
                    return ready, None
                if slot.ready_at > now:
                    return ready, slot.ready_at
            ready.append(slots.popleft())
        return ready, None

    def commit(self, ready: list[_Slot]) -> list[StatusEvent]:
        """Apply popped slots in order; returns the events they produce."""
        events: list[StatusEvent] = []
        for slot in ready:
            self.committed = slot.seq
            summary = slot.summary
            if summary is None:
                continue  # a duplicate: nothing changes
            writes: tuple[tuple[KVSKey, KVSDatum], ...] = ()
            block = 0
            if summary.success:
                writes = summary.values_written
                info = BatchStatusInfo(slot.tx_id, COMMITTED)
                self.height += 1
                block = self.height
            else:
                info = BatchStatusInfo(slot.tx_id, INVALID, summary.invalid)
            self.event_seq += 1
            self.last_fingerprint = slot.fingerprint
            events.append(StatusEvent(self.event_seq, info, writes, slot.fingerprint, block))
        return events
