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
    KVSPrefixDone,
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


def lock(
    ts: int, *, eager=E, lazy=E, will=E, may=E, rp=E, wp=E, executor: Any = 9
) -> KVSAcquireLock:  # type: ignore[no-untyped-def]
    return KVSAcquireLock(lazy, eager, will, may, "worker", executor, fp(ts), rp, wp)


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


# --- shard: key prefixes ---------------------------------------------------------------


def test_a_write_prefix_holds_back_reads_of_every_key_under_it() -> None:
    out = Outbox()
    shard = Shard(0, out, {"abc": b"0", "abd": b"0", "xyz": b"0"})
    shard.handle(lock(1, wp=frozenset({"ab"}), executor=1))
    shard.handle(lock(2, eager=frozenset({"abc", "abd", "xyz"}), executor=2))
    shard.handle(UpdateSeenAll(fp(2)))
    # "xyz" is not under "ab": read at once; the others wait for what 1 wrote under it.
    assert [m for _, m in out.take() if isinstance(m, KVSRead)] == [KVSRead(fp(2), "xyz", b"0")]
    shard.handle(KVSPrefixDone(fp(1), (("abc", b"1"),)))
    assert sorted((m.key, m.data) for _, m in out.take()) == [
        ("abc", b"1"),  # written under the prefix
        ("abd", b"0"),  # left unchanged by it
    ]
    assert shard.pending_markers() == 0
    assert shard.state == {"abc": b"1", "abd": b"0", "xyz": b"0"}


def test_a_read_prefix_reads_any_key_under_it_and_keeps_its_version() -> None:
    out = Outbox()
    shard = Shard(0, out, {"abc": b"0"})
    shard.handle(lock(1, rp=frozenset({"ab"}), executor=1))
    shard.handle(lock(2, will=frozenset({"abc"}), executor=2))
    shard.handle(UpdateSeenAll(fp(2)))
    shard.handle(KVSWrite(fp(2), "abc", b"2"))  # a later write does not wait for the read
    assert shard.state == {"abc": b"0"}  # ... but is not folded while 1 may read "abc"
    out.take()
    shard.handle(KVSReadRequest(fp(1), "abc", True))
    shard.handle(KVSReadRequest(fp(1), "abz", True))  # a key nothing else names
    assert out.take() == [(1, KVSRead(fp(1), "abc", b"0")), (1, KVSRead(fp(1), "abz", None))]
    assert shard.state == {"abc": b"0"}
    shard.handle(KVSPrefixDone(fp(1)))
    assert shard.state == {"abc": b"2"} and shard.pending_markers() == 0
    shard.handle(lock(3, rp=frozenset({"ab"})))
    with pytest.raises(RuntimeError, match="no lazy read"):
        shard.handle(KVSReadRequest(fp(3), "xyz", True))  # not under the prefix


def test_prefix_writes_after_a_read_do_not_hold_it_back() -> None:
    out = Outbox()
    shard = Shard(0, out, {"abc": b"0"})
    shard.handle(lock(1, rp=frozenset({"a"}), executor=1))
    shard.handle(lock(2, wp=frozenset({""}), executor=2))  # the empty prefix: every key
    shard.handle(lock(3, lazy=frozenset({"abc"}), executor=3))
    shard.handle(UpdateSeenAll(fp(3)))
    out.take()
    shard.handle(KVSReadRequest(fp(1), "abc", True))
    assert out.take() == [(1, KVSRead(fp(1), "abc", b"0"))]
    shard.handle(KVSReadRequest(fp(3), "abc", True))
    assert out.take() == []  # 2 may have written it
    shard.handle(KVSPrefixDone(fp(2), (("abc", b"2"),)))
    assert out.take() == [(3, KVSRead(fp(3), "abc", b"2"))]
    assert shard.state == {"abc": b"0"}  # 1 still holds its read prefix
    shard.handle(KVSPrefixDone(fp(1)))
    assert shard.state == {"abc": b"2"} and shard.pending_markers() == 0


def test_a_write_folds_once_the_earlier_prefix_markers_are_released() -> None:
    out = Outbox()
    shard = Shard(0, out, {"abc": b"0"})
    shard.handle(lock(1, rp=frozenset({"ab"})))
    shard.handle(lock(2, will=frozenset({"abc"})))
    shard.handle(lock(3, rp=frozenset({"ab"})))
    shard.handle(UpdateSeenAll(fp(3)))
    shard.handle(KVSWrite(fp(2), "abc", b"2"))
    assert shard.state == {"abc": b"0"}
    shard.handle(KVSPrefixDone(fp(1)))
    assert shard.state == {"abc": b"2"}  # 3 holds the prefix still, but reads after 2
    shard.handle(KVSPrefixDone(fp(3)))
    assert shard.pending_markers() == 0


def test_prefix_messages_before_their_lock_are_held_back() -> None:
    out = Outbox()
    shard = Shard(0, out)
    shard.handle(KVSPrefixDone(fp(1), (("abc", b"1"),)))
    assert shard.state == {}
    shard.handle(lock(1, wp=frozenset({"ab"})))
    shard.handle(UpdateSeenAll(fp(1)))
    assert shard.state == {"abc": b"1"} and shard.pending_markers() == 0


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


def test_worker_locks_a_prefix_on_every_shard() -> None:
    out = Outbox()
    worker = Worker(out, 3, lambda key: 0, clock=lambda: 42)
    worker.handle(
        TransactionRequest(
            candidate("a", eager_read=frozenset({"b"}), write_prefixes=frozenset({"1c"}))
        )
    )
    out.take()
    worker.handle(ExecutorPIDAssigned(7))
    locks = sorted(
        (a, m.eager_read_keys, m.write_prefixes)
        for a, m in out.take()
        if isinstance(m, KVSAcquireLock)
    )
    assert locks == [
        (("shard", 0), frozenset({"b"}), frozenset({"1c"})),
        (("shard", 1), E, frozenset({"1c"})),
        (("shard", 2), E, frozenset({"1c"})),
    ]
    for shard in (2, 0):
        worker.handle(KVSLockAcquired(fp(0), shard))
        assert not worker.tick()  # every shard must have locked it
    worker.handle(KVSLockAcquired(fp(0), 1))
    assert worker.tick()


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


def test_executor_reads_and_writes_under_prefixes_and_ends_them_on_every_shard() -> None:
    out = Outbox()
    shards = [("shard", 0), ("shard", 1)]
    executor = Executor(1, out, lambda key: shards[key[-1] == "2"], shards)

    def program() -> Program:
        value = yield "ab2"
        return ProgramResult(writes={"ab1": b"x", "ab2": (value or b"") + b"!", "m": b"y"})

    label = TransactionLabel(
        may_write=frozenset({"m"}),
        read_prefixes=frozenset({"ab"}),
        write_prefixes=frozenset({"a"}),
    )
    executor.handle(ExecuteTransaction(program, label, fp(0), "t"))
    assert out.take() == [(("shard", 1), KVSReadRequest(fp(0), "ab2", True))]
    executor.handle(KVSRead(fp(0), "ab2", b"v"))
    sent = out.take()
    assert (("shard", 0), KVSWrite(fp(0), "m", b"y")) in sent  # named alone: its own write
    assert (("shard", 0), KVSPrefixDone(fp(0), (("ab1", b"x"),))) in sent
    assert (("shard", 1), KVSPrefixDone(fp(0), (("ab2", b"v!"),))) in sent
    summary = next(m for _, m in sent if isinstance(m, ExecutionSummary))
    assert summary.success and dict(summary.values_written) == {
        "ab1": b"x",
        "ab2": b"v!",
        "m": b"y",
    }


@pytest.mark.parametrize("violation", ["read", "write"])
def test_executor_refuses_keys_outside_its_prefixes(violation: str) -> None:
    out = Outbox()
    executor = Executor(1, out, lambda key: ("shard", 0), [("shard", 0)])

    def program() -> Program:
        if violation == "read":
            yield "ba"  # "ab" may be written, not read
        return ProgramResult(writes={"ab": b"x", "b": b"y"})

    label = TransactionLabel(read_prefixes=frozenset({"b"}), write_prefixes=frozenset({"a"}))
    executor.handle(ExecuteTransaction(program, label, fp(0), "t"))
    executor.handle(KVSRead(fp(0), "ba", None))
    sent = [m for _, m in out.take()]
    summary = next(m for m in sent if isinstance(m, ExecutionSummary))
    assert not summary.success and summary.values_written == ()
    assert KVSPrefixDone(fp(0), ()) in sent  # ends its prefixes, having written nothing


def test_supervisor_spawns_without_waiting_for_running_executors() -> None:
    out = Outbox()
    registered: dict[int, Executor] = {}
    supervisor = ExecutionSupervisor(
        out, registered.__setitem__, lambda k: ("shard", 0), [("shard", 0)]
    )
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
