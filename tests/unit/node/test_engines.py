"""Each engine alone: messages in, messages out."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerq.node.ordering.executor import Executor
from ledgerq.node.ordering.messages import (
    ExecuteTransaction,
    ExecutionSummary,
    ExecutorFinished,
    ExecutorPIDAssigned,
    KVSAcquireLock,
    KVSLockAcquired,
    KVSRead,
    KVSReadRequest,
    KVSWrite,
    Program,
    ProgramResult,
    RequestLogs,
    SendLog,
    SpawnExecutor,
    TransactionAck,
    TransactionCandidate,
    TransactionLabel,
    TransactionRequest,
    TxFingerprint,
    UnknownMessageError,
    UpdateSeenAll,
)
from ledgerq.node.ordering.shard import Shard
from ledgerq.node.ordering.supervisor import ExecutionSupervisor
from ledgerq.node.ordering.worker import Worker

E: frozenset[str] = frozenset()


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, Any]] = []

    def __call__(self, address: Any, msg: Any) -> None:
        self.sent.append((address, msg))

    def take(self) -> list[tuple[Any, Any]]:
        out, self.sent = self.sent, []
        return out


def fp(n: int) -> TxFingerprint:
    return TxFingerprint(0, n)


def lock(ts: int, *, eager=E, lazy=E, will=E, may=E, executor: Any = 9) -> KVSAcquireLock:  # type: ignore[no-untyped-def]
    return KVSAcquireLock(lazy, eager, will, may, "worker", executor, fp(ts))


# --- shard -------------------------------------------------------------------------


def test_shard_answers_a_read_only_after_seen_all_and_the_previous_write() -> None:
    out = Outbox()
    shard = Shard(0, out, {"k": b"0"})
    shard.handle(lock(1, will=frozenset({"k"}), executor=1))
    shard.handle(lock(2, eager=frozenset({"k"}), executor=2))
    assert out.take() == [
        ("worker", KVSLockAcquired(fp(1), 0)),
        ("worker", KVSLockAcquired(fp(2), 0)),
    ]
    shard.handle(UpdateSeenAll(fp(2)))
    assert out.take() == []  # the write at 1 is still unknown
    shard.handle(KVSWrite(fp(1), "k", b"1"))
    assert out.take() == [(2, KVSRead(fp(2), "k", b"1"))]
    assert shard.pending_markers() == 0 and shard.state == {"k": b"1"}


def test_shard_waits_for_update_seen_all() -> None:
    out = Outbox()
    shard = Shard(0, out, {"k": b"0"})
    shard.handle(lock(5, eager=frozenset({"k"})))
    out.take()
    shard.handle(UpdateSeenAll(fp(4)))
    assert out.take() == []  # a lock before 5 could still come
    shard.handle(UpdateSeenAll(fp(5)))
    assert out.take() == [(9, KVSRead(fp(5), "k", b"0"))]


def test_a_may_write_left_unchanged_is_skipped() -> None:
    out = Outbox()
    shard = Shard(0, out, {"k": b"0"})
    shard.handle(lock(1, may=frozenset({"k"})))
    shard.handle(lock(2, may=frozenset({"k"})))
    shard.handle(lock(3, lazy=frozenset({"k"}), executor=3))
    shard.handle(UpdateSeenAll(fp(3)))
    shard.handle(KVSWrite(fp(1), "k", b"1"))
    shard.handle(KVSWrite(fp(2), "k", None))
    out.take()
    shard.handle(KVSReadRequest(fp(3), "k", True))
    assert out.take() == [(3, KVSRead(fp(3), "k", b"1"))]


def test_messages_before_their_lock_are_held_back() -> None:
    out = Outbox()
    shard = Shard(0, out)
    shard.handle(KVSWrite(fp(1), "k", b"x"))
    assert shard.state == {}
    shard.handle(lock(1, will=frozenset({"k"})))
    shard.handle(UpdateSeenAll(fp(1)))
    assert shard.state == {"k": b"x"}


def test_a_lock_below_seen_all_is_refused_and_unknown_messages_raise() -> None:
    shard = Shard(0, Outbox())
    shard.handle(UpdateSeenAll(fp(3)))
    with pytest.raises(RuntimeError, match="after UpdateSeenAll"):
        shard.handle(lock(2, will=frozenset({"k"})))
    with pytest.raises(UnknownMessageError):
        shard.handle(SpawnExecutor())


def test_lazy_read_not_needed_releases_the_key() -> None:
    out = Outbox()
    shard = Shard(0, out, {"k": b"0"})
    shard.handle(lock(1, lazy=frozenset({"k"})))
    shard.handle(lock(2, will=frozenset({"k"})))
    shard.handle(UpdateSeenAll(fp(2)))
    shard.handle(KVSWrite(fp(2), "k", b"2"))
    assert shard.state == {"k": b"0"}  # the lazy read at 1 may still want the old value
    shard.handle(KVSReadRequest(fp(1), "k", False))
    assert shard.state == {"k": b"2"} and shard.pending_markers() == 0


# --- worker ------------------------------------------------------------------------


def candidate(tx_id: str, **label: frozenset[str]) -> TransactionCandidate:
    def run() -> Program:
        return ProgramResult()
        yield  # pragma: no cover

    return TransactionCandidate(tx_id, TransactionLabel(**label), run)


def make_worker(out: Outbox, shards: int = 2) -> Worker:
    return Worker(out, shards, lambda key: 0 if key < "m" else 1, clock=lambda: 42)


def test_worker_orders_dedupes_and_honours_resubmission() -> None:
    out = Outbox()
    worker = make_worker(out)
    a = candidate("a")
    worker.handle(TransactionRequest(a))
    worker.handle(TransactionRequest(a))
    sent = out.take()
    assert sent[0] == ("issuer", TransactionAck("a", 0, 42, fp(0)))
    assert sent[1] == ("supervisor", SpawnExecutor("worker"))
    assert sent[2] == ("issuer", TransactionAck("a", 0, 42, None, duplicate=True))
    assert len(sent) == 3
    worker.handle(TransactionRequest(a, resubmission=fp(0)))
    assert out.take()[0] == ("issuer", TransactionAck("a", 0, 42, fp(1)))
    worker.handle(TransactionRequest(a, resubmission=fp(0)))  # 1 is after 0: disregarded
    assert out.take()[0][1].duplicate


def test_worker_sends_update_seen_all_only_past_fully_locked_prefixes() -> None:
    out = Outbox()
    worker = make_worker(out)
    worker.handle(TransactionRequest(candidate("a", eager_read=frozenset({"b", "z"}))))
    worker.handle(TransactionRequest(candidate("b", will_write=frozenset({"c"}))))
    out.take()
    worker.handle(ExecutorPIDAssigned(7))
    worker.handle(ExecutorPIDAssigned(8))
    sent = out.take()
    assert sent[0] == (7, ExecuteTransaction(sent[0][1].executable, sent[0][1].label, fp(0), "a"))
    locks = [(a, m) for a, m in sent if isinstance(m, KVSAcquireLock)]
    assert sorted((a, m.timestamp, m.executor) for a, m in locks) == [
        (("shard", 0), fp(0), 7),
        (("shard", 0), fp(1), 8),
        (("shard", 1), fp(0), 7),
    ]
    worker.handle(KVSLockAcquired(fp(1), 0))
    worker.handle(KVSLockAcquired(fp(0), 0))
    assert not worker.tick()  # fp 0 still waits for shard 1
    assert out.take() == []
    worker.handle(KVSLockAcquired(fp(0), 1))
    assert worker.tick()
    assert out.take() == [
        (("shard", 0), UpdateSeenAll(fp(1))),
        (("shard", 1), UpdateSeenAll(fp(1))),
    ]
    assert not worker.tick()


def test_worker_keeps_logs_for_request_logs() -> None:
    out = Outbox()
    worker = make_worker(out)
    summary = ExecutionSummary(fp(0), "a", True, (), ())
    worker.handle(ExecutorFinished(fp(0), "0.0", summary))
    worker.handle(RequestLogs(fp(0)))
    worker.handle(RequestLogs(fp(1)))
    assert out.take() == [("issuer", SendLog(fp(0), summary)), ("issuer", SendLog(fp(1), None))]
    with pytest.raises(UnknownMessageError):
        worker.handle(KVSRead(fp(0), "k", None))


def _logs_kept(worker: Worker, out: Outbox, count: int) -> list[int]:
    for n in range(count):
        worker.handle(RequestLogs(fp(n)))
    return [n for n, (_, msg) in enumerate(out.take()) if msg.summary is not None]


def test_worker_bounds_kept_logs_by_count_and_by_the_values_they_hold() -> None:
    out = Outbox()
    worker = Worker(out, 2, lambda key: 0, clock=lambda: 42, keep_logs=3, keep_log_entries=10)
    for n in range(5):  # one value read and one written each: 3 entries per summary
        summary = ExecutionSummary(fp(n), str(n), True, (("k", None),), (("k", b"1"),))
        worker.handle(ExecutorFinished(fp(n), f"0.{n}", summary))
    assert _logs_kept(worker, out, 5) == [2, 3, 4]  # the count bound: the last three

    # One large summary (a batch of many transactions) pushes out older ones
    # by the values it holds, but the newest is always kept.
    wide = tuple((f"k{i}", b"1") for i in range(8))
    worker.handle(ExecutorFinished(fp(5), "0.5", ExecutionSummary(fp(5), "5", True, (), wide)))
    assert _logs_kept(worker, out, 6) == [5]
    huge = tuple((f"k{i}", b"1") for i in range(50))
    worker.handle(ExecutorFinished(fp(6), "0.6", ExecutionSummary(fp(6), "6", True, (), huge)))
    assert _logs_kept(worker, out, 7) == [6]

    # Small ones fill up again to the value bound, dropping the large one.
    for n in range(7, 10):
        summary = ExecutionSummary(fp(n), str(n), True, (("k", None),), (("k", b"1"),))
        worker.handle(ExecutorFinished(fp(n), f"0.{n}", summary))
    assert _logs_kept(worker, out, 10) == [7, 8, 9]


def test_worker_windows_keep_the_latest_entries_through_their_dicts_compaction() -> None:
    # The windows' dicts are copied every half window (see worker._compact): what
    # they answer must not change across the copies.
    out = Outbox()
    worker = Worker(out, 2, lambda key: 0, clock=lambda: 42, dedupe_window=10, keep_logs=10)
    for n in range(3_000):
        worker.handle(TransactionRequest(candidate(f"t{n}")))
        summary = ExecutionSummary(fp(n), str(n), True, (), (("k", b"1"),))
        worker.handle(ExecutorFinished(fp(n), f"0.{n}", summary))
    out.take()
    assert [n for n in range(3_000) if worker.ordered(f"t{n}") is not None] == list(
        range(2_990, 3_000)
    )
    assert _logs_kept(worker, out, 3_000) == list(range(2_990, 3_000))
    worker.handle(TransactionRequest(candidate("t2995")))  # in the window: a duplicate
    assert out.take()[0][1].duplicate
    worker.handle(TransactionRequest(candidate("t5")))  # long gone: ordered again
    assert not out.take()[0][1].duplicate


# --- executor and supervisor -------------------------------------------------------------


def run_executor(
    program: Any, label: TransactionLabel, reads: dict[str, bytes | None]
) -> list[Any]:
    out = Outbox()
    executor = Executor(1, out, lambda key: ("shard", 0))
    executor.handle(ExecuteTransaction(program, label, fp(0), "t"))
    for key, value in reads.items():
        executor.handle(KVSRead(fp(0), key, value))
    return [m for _, m in out.sent]


def test_executor_requests_lazy_reads_and_writes_every_write_key() -> None:
    def program() -> Program:
        value = yield "lazy"
        return ProgramResult(writes={"w": (value or b"") + b"!"})

    label = TransactionLabel(
        lazy_read=frozenset({"lazy", "unused"}),
        will_write=frozenset({"w"}),
        may_write=frozenset({"m"}),
    )
    sent = run_executor(program, label, {"lazy": b"v"})
    assert KVSReadRequest(fp(0), "lazy", True) in sent
    assert KVSReadRequest(fp(0), "unused", False) in sent
    assert KVSWrite(fp(0), "w", b"v!") in sent and KVSWrite(fp(0), "m", None) in sent
    summary = next(m for m in sent if isinstance(m, ExecutionSummary))
    assert summary.success and summary.values_read == (("lazy", b"v"),)


@pytest.mark.parametrize("violation", ["read", "write", "raise"])
def test_executor_refuses_label_violations(violation: str) -> None:
    def program() -> Program:
        if violation == "read":
            yield "elsewhere"
        if violation == "raise":
            raise ValueError("boom")
        return ProgramResult(writes={"elsewhere": b"x", "m": b"y"})

    label = TransactionLabel(may_write=frozenset({"m"}))
    sent = run_executor(program, label, {})
    summary = next(m for m in sent if isinstance(m, ExecutionSummary))
    assert not summary.success and summary.invalid
    assert KVSWrite(fp(0), "m", None) in sent  # a failed candidate writes nothing
    assert any(isinstance(m, ExecutorFinished) for m in sent)


def test_supervisor_spawns_without_waiting_for_running_executors() -> None:
    out = Outbox()
    registered: dict[int, Executor] = {}
    supervisor = ExecutionSupervisor(out, registered.__setitem__, lambda k: ("shard", 0))
    for _ in range(3):
        supervisor.handle(SpawnExecutor())
    assert [m for _, m in out.take()] == [
        ExecutorPIDAssigned(1),
        ExecutorPIDAssigned(2),
        ExecutorPIDAssigned(3),
    ]
    assert sorted(registered) == [1, 2, 3] and not any(e.done for e in registered.values())
    with pytest.raises(UnknownMessageError):
        supervisor.handle(UpdateSeenAll(fp(0)))
