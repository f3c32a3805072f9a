"""The node running intkey batches in-process: rules, atomicity, dedupe, logs, durability."""

from __future__ import annotations

import asyncio
import contextvars
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import cbor2
import pytest

from ledgerq.codec import Signer, make_batch, make_transaction
from ledgerq.codec.intkey import NAMESPACE, encode_payload, make_address, make_intkey_batch
from ledgerq.errors import NodeBusyError
from ledgerq.node import Node, TxFingerprint

SIGNER = Signer.generate()


def value_of(data: bytes | None, name: str) -> int | None:
    return None if data is None else cbor2.loads(data)[name]


def raw_tx(
    payload: bytes, inputs: tuple[str, ...], outputs: tuple[str, ...], family: str = "intkey"
):  # type: ignore[no-untyped-def]
    return make_transaction(
        SIGNER,
        family_name=family,
        family_version="1.0",
        inputs=inputs,
        outputs=outputs,
        payload=payload,
    )


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    n = await Node.open(None, shards=3)
    yield n
    await n.close()


async def run(node: Node, *batches) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    await node.submit(list(batches))
    infos = await node.batch_statuses([b.header_signature for b in batches], wait=10)
    return {
        bid: (i.status, i.invalid_transactions[0].message if i.invalid_transactions else "")
        for bid, i in infos.items()
    }


async def test_set_inc_dec_commit_in_order(node: Node) -> None:
    b1 = make_intkey_batch(SIGNER, [("set", "a", 10)])
    b2 = make_intkey_batch(SIGNER, [("inc", "a", 5), ("dec", "a", 3)])
    out = await run(node, b1, b2)
    assert set(out.values()) == {("COMMITTED", "")}
    assert value_of(await node.get_state(make_address("a")), "a") == 12


@pytest.mark.parametrize(
    ("setup", "op", "message"),
    [
        ([], ("inc", "x", 1), 'Verb is "inc" but name "x" not in state'),
        ([], ("dec", "x", 1), 'Verb is "dec" but name "x" not in state'),
        ([("set", "x", 1)], ("set", "x", 2), 'Verb is "set", but already exists: Name: x, Value 1'),
        ([("set", "x", 2**32 - 1)], ("inc", "x", 1), "result would be greater than 4294967295"),
        ([("set", "x", 0)], ("dec", "x", 1), "result would be less than 0"),
        ([], ("bad", "x", 1), 'Verb must be "set", "inc", or "dec"'),
        ([], ("set", "n" * 21, 1), "Name must be a string of no more than 20 characters"),
        ([], ("set", "x", 2**32), "Value must be an integer no less than 0"),
        ([], ("set", "x", -1), "Value must be an integer no less than 0"),
    ],
)
async def test_every_intkey_rule(node: Node, setup, op, message) -> None:  # type: ignore[no-untyped-def]
    if setup:
        assert await run(node, make_intkey_batch(SIGNER, setup))
    bad = make_intkey_batch(SIGNER, [op])
    ((status, got),) = (await run(node, bad)).values()
    assert status == "INVALID"
    assert message in got


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "Invalid payload serialization"),
        (b"\xff\x00garbage", "Invalid payload serialization"),
        (cbor2.dumps([1, 2]), "Invalid payload serialization"),
        (cbor2.dumps({"Name": "x", "Value": 1}), "Verb is required"),
        (cbor2.dumps({"Verb": "set", "Value": 1}), "Name is required"),
        (cbor2.dumps({"Verb": "set", "Name": "x"}), "Value is required"),
        (cbor2.dumps({"Verb": "set", "Name": "x", "Value": True}), "Value must be an integer"),
        (cbor2.dumps({"Verb": "set", "Name": 7, "Value": 1}), "Name must be a string"),
    ],
)
async def test_malformed_payloads_are_invalid(node: Node, payload: bytes, message: str) -> None:
    addr = make_address("x")
    batch = make_batch(SIGNER, [raw_tx(payload, (addr,), (addr,))])
    ((status, got),) = (await run(node, batch)).values()
    assert (status, message in got) == ("INVALID", True)


async def test_batch_is_atomic(node: Node) -> None:
    await run(node, make_intkey_batch(SIGNER, [("set", "a", 1)]))
    mixed = make_intkey_batch(SIGNER, [("inc", "a", 1), ("set", "b", 5), ("inc", "zz", 1)])
    ((status, msg),) = (await run(node, mixed)).values()
    assert status == "INVALID" and "zz" in msg
    info = (await node.batch_statuses([mixed.header_signature]))[mixed.header_signature]
    assert info.invalid_transactions[0].id == mixed.transactions[2].header_signature
    assert value_of(await node.get_state(make_address("a")), "a") == 1
    assert await node.get_state(make_address("b")) is None


async def test_reads_and_writes_outside_the_label_are_refused(node: Node) -> None:
    a, b = make_address("a"), make_address("b")
    no_input = make_batch(SIGNER, [raw_tx(encode_payload("set", "a", 1), (b,), (a,))])
    no_output = make_batch(SIGNER, [raw_tx(encode_payload("set", "a", 1), (a,), (b,))])
    out = await run(node, no_input, no_output)
    assert out[no_input.header_signature] == (
        "INVALID",
        f"Tried to get unauthorized address {a}",
    )
    assert out[no_output.header_signature] == ("INVALID", f"Tried to set unauthorized address {a}")
    assert await node.get_state(a) is None


async def test_namespace_prefixes_cover_every_address_under_them(node: Node) -> None:
    a = make_address("a")

    def tx(verb: str, value: int, inputs: tuple[str, ...], outputs: tuple[str, ...]):  # type: ignore[no-untyped-def]
        return raw_tx(encode_payload(verb, "a", value), inputs, outputs)

    batches = [
        make_batch(SIGNER, [tx("set", 1, (NAMESPACE,), (NAMESPACE,))]),
        make_batch(SIGNER, [tx("inc", 2, (a[:8],), ("",))]),  # "": every address
        make_batch(SIGNER, [tx("inc", 3, (a,), (a[:68],)), tx("inc", 4, ("1c",), (a,))]),
    ]
    out = await run(node, *batches)
    assert set(out.values()) == {("COMMITTED", "")}
    assert value_of(await node.get_state(a), "a") == 10

    outside = "ab"  # no intkey address begins with it
    no_input = make_batch(SIGNER, [tx("inc", 1, (outside,), (NAMESPACE,))])
    no_output = make_batch(SIGNER, [tx("inc", 1, (NAMESPACE,), (outside,))])
    out = await run(node, no_input, no_output)
    assert out[no_input.header_signature] == ("INVALID", f"Tried to get unauthorized address {a}")
    assert out[no_output.header_signature] == ("INVALID", f"Tried to set unauthorized address {a}")
    assert value_of(await node.get_state(a), "a") == 10


async def test_prefixed_and_single_address_batches_interleave_as_in_order(node: Node) -> None:
    a = make_address("a")
    entries = [(a,), (NAMESPACE,), ("",), (a[:10],)]
    batches = [make_intkey_batch(SIGNER, [("set", "a", 0)])] + [
        make_batch(
            SIGNER,
            [raw_tx(encode_payload("inc", "a", 1), entries[n % 4], entries[(n // 4) % 4])],
        )
        for n in range(32)
    ]
    out = await run(node, *batches)
    assert set(out.values()) == {("COMMITTED", "")}
    assert value_of(await node.get_state(a), "a") == 32


@pytest.mark.parametrize(
    "entry",
    ["1cf12", "1CF126", "1cf126zz", make_address("a") + "00", make_address("a")[:-1] + "g"],
)
async def test_entries_neither_address_nor_prefix_are_invalid(node: Node, entry: str) -> None:
    a = make_address("a")
    bad_input = make_batch(SIGNER, [raw_tx(encode_payload("set", "a", 1), (entry,), (a,))])
    bad_output = make_batch(SIGNER, [raw_tx(encode_payload("set", "a", 1), (a,), (a, entry))])
    out = await run(node, bad_input, bad_output)
    for batch, kind in ((bad_input, "inputs"), (bad_output, "outputs")):
        status, message = out[batch.header_signature]
        assert status == "INVALID"
        assert message.startswith(f"{kind} entry {entry!r} is neither a state address")
    assert await node.get_state(a) is None


async def test_unknown_families_are_invalid(node: Node) -> None:
    a = make_address("a")
    other = make_batch(SIGNER, [raw_tx(b"x", (a,), (a,), family="nope")])
    out = await run(node, other)
    assert "no transaction processor for family 'nope'" in out[other.header_signature][1]


async def test_same_batch_twice_executes_once(node: Node) -> None:
    await run(node, make_intkey_batch(SIGNER, [("set", "a", 1)]))
    inc = make_intkey_batch(SIGNER, [("inc", "a", 1)])
    await run(node, inc)
    await run(node, inc, inc)
    await node.submit([inc])
    await node.batch_statuses([inc.header_signature], wait=1)
    assert value_of(await node.get_state(make_address("a")), "a") == 2


async def test_resubmission_executes_again(node: Node) -> None:
    inc = make_intkey_batch(SIGNER, [("inc", "a", 1)])
    assert (await run(node, inc))[inc.header_signature][0] == "INVALID"
    first = node.fingerprint_of(inc.header_signature)
    assert first is not None
    await run(node, make_intkey_batch(SIGNER, [("set", "a", 1)]))
    await node.submit([inc], resubmission=first)
    # PENDING again until the second execution commits.
    assert (await node.batch_statuses([inc.header_signature], wait=10))[
        inc.header_signature
    ].status == "COMMITTED"
    second = node.fingerprint_of(inc.header_signature)
    assert second is not None and second > first
    # A stale reference (before the latest ordering) is disregarded.
    await node.submit([inc], resubmission=TxFingerprint(0, 0))
    await node.batch_statuses([inc.header_signature], wait=5)
    await asyncio.sleep(0.05)
    assert node.fingerprint_of(inc.header_signature) == second
    assert (await node.batch_statuses([inc.header_signature]))[inc.header_signature].status == (
        "COMMITTED"
    )
    assert value_of(await node.get_state(make_address("a")), "a") == 2


async def test_request_logs_returns_the_execution_summary(node: Node) -> None:
    batch = make_intkey_batch(SIGNER, [("set", "a", 3)])
    await run(node, batch)
    fp = node.fingerprint_of(batch.header_signature)
    assert fp is not None
    summary = await node.request_logs(fp)
    assert summary is not None and summary.tx_id == batch.header_signature and summary.success
    assert summary.values_written[0][0] == make_address("a")
    assert await node.request_logs(TxFingerprint(999, 0)) is None


async def test_request_logs_leaves_running_the_machine_to_the_driver(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GET /logs delivers one RequestLogs and waits; it never runs the machine (all
    # its pending work) inside the request's handler.
    in_handler: contextvars.ContextVar[bool] = contextvars.ContextVar("in_handler", default=False)
    run_machine = node.machine.run

    def guarded(budget: int | None = None) -> bool:
        assert not in_handler.get(), "the request's handler ran the machine"
        return run_machine(budget)

    monkeypatch.setattr(node.machine, "run", guarded)
    batch = make_intkey_batch(SIGNER, [("set", "l", 1)])
    await run(node, batch)
    fp = node.fingerprint_of(batch.header_signature)
    assert fp is not None
    in_handler.set(True)  # seen by this task only, not by the node's driver task
    summary = await node.request_logs(fp)
    assert summary is not None and summary.tx_id == batch.header_signature


async def test_smaller_memory_windows_keep_fewer_logs_and_still_dedupe_for_ever() -> None:
    # `ledgerq node --dedupe-window 3 --keep-logs 3`: memory holds the last three
    # orderings and summaries; an older batch id is still a duplicate (the store).
    node = await Node.open(None, dedupe_window=3, keep_logs=3)
    try:
        batches = [make_intkey_batch(SIGNER, [("set", f"w{i}", 1)]) for i in range(8)]
        for batch in batches:
            await run(node, batch)
        fps = [node.fingerprint_of(b.header_signature) for b in batches]
        kept = [await node.request_logs(fp) is not None for fp in fps if fp is not None]
        assert kept == [False] * 5 + [True] * 3
        first = make_intkey_batch(SIGNER, [("inc", "w0", 1)])
        await run(node, first)
        await run(node, batches[0], first)  # both long out of the window
        assert value_of(await node.get_state(make_address("w0")), "w0") == 2
    finally:
        await node.close()


async def test_max_pending_raises_busy() -> None:
    node = await Node.open(None, max_pending=2, commit_delay_ms=60_000)
    try:
        await node.submit([make_intkey_batch(SIGNER, [("set", f"p{i}", 1)]) for i in range(2)])
        with pytest.raises(NodeBusyError):
            await node.submit([make_intkey_batch(SIGNER, [("set", "p9", 1)])])
    finally:
        await node.close()


async def test_commit_delay_keeps_batches_pending() -> None:
    now = [1_000]
    node = await Node.open(None, commit_delay_ms=500, clock=lambda: now[0])
    try:
        batch = make_intkey_batch(SIGNER, [("set", "d", 1)])
        await node.submit([batch])
        infos = await node.batch_statuses([batch.header_signature], wait=0.2)
        assert infos[batch.header_signature].status == "PENDING"
        now[0] += 500
        infos = await node.batch_statuses([batch.header_signature], wait=5)
        assert infos[batch.header_signature].status == "COMMITTED"
    finally:
        await node.close()


async def test_events_are_numbered_and_resumable(node: Node) -> None:
    stream = node.subscribe(after=0)
    batches = [make_intkey_batch(SIGNER, [("set", f"e{i}", i)]) for i in range(3)]
    bad = make_intkey_batch(SIGNER, [("inc", "nope", 1)])
    await run(node, *batches, bad)
    got = [await asyncio.wait_for(stream.__anext__(), 5) for _ in range(4)]
    assert [e.seq for e in got] == [1, 2, 3, 4]
    assert [e.info.id for e in got] == [b.header_signature for b in (*batches, bad)]
    assert got[3].info.status == "INVALID"
    resumed = node.subscribe(after=2)
    assert (await asyncio.wait_for(resumed.__anext__(), 5)).seq == 3


async def test_many_waiters_wake_on_commit() -> None:
    node = await Node.open(None, commit_delay_ms=50)
    try:
        batch = make_intkey_batch(SIGNER, [("set", "w", 1)])
        await node.submit([batch])
        waiters = [
            asyncio.create_task(node.batch_statuses([batch.header_signature], wait=30))
            for _ in range(300)
        ]
        done = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert {d[batch.header_signature].status for d in done} == {"COMMITTED"}
        # As Sawtooth: nothing PENDING among the ids, nothing to wait for.
        unknown = make_intkey_batch(SIGNER, [("set", "w", 2)]).header_signature
        answer = await asyncio.wait_for(node.batch_statuses([unknown], wait=300), 1)
        assert answer[unknown].status == "UNKNOWN"
    finally:
        await node.close()


async def test_restart_keeps_state_and_statuses(tmp_path: Path) -> None:
    node = await Node.open(tmp_path, snapshot_every=3)
    batches = [make_intkey_batch(SIGNER, [("set", "r", 1)])]
    batches += [make_intkey_batch(SIGNER, [("inc", "r", 1)]) for _ in range(6)]
    await run(node, *batches)
    await node.close()
    again = await Node.open(tmp_path)
    try:
        assert value_of(await again.get_state(make_address("r")), "r") == 7
        infos = await again.batch_statuses([b.header_signature for b in batches])
        assert {i.status for i in infos.values()} == {"COMMITTED"}
        await again.submit(batches)  # already final: disregarded
        await asyncio.sleep(0.05)
        assert value_of(await again.get_state(make_address("r")), "r") == 7
    finally:
        await again.close()


async def test_journal_replay_after_a_crash_applies_once(tmp_path: Path) -> None:
    live, image = tmp_path / "live", tmp_path / "image"
    node = await Node.open(live, snapshot_every=10**6, store_interval_s=3600)
    batches = [make_intkey_batch(SIGNER, [("set", "c", 1)])]
    batches += [make_intkey_batch(SIGNER, [("inc", "c", 1)]) for _ in range(4)]
    try:
        await run(node, *batches[:2])
        await node.snapshot()
        await run(node, *batches[2:])  # only in the journal
        # The disk as a kill -9 would leave it: no final snapshot, journal past the last one.
        shutil.copytree(live, image)
    finally:
        await node.close()
    records = sorted(p.name for p in image.iterdir())
    assert "store" in records and any(n.startswith("journal-") for n in records)
    again = await Node.open(image)
    try:
        assert value_of(await again.get_state(make_address("c")), "c") == 5
        infos = await again.batch_statuses([b.header_signature for b in batches])
        assert {i.status for i in infos.values()} == {"COMMITTED"}
    finally:
        await again.close()


async def test_ephemeral_forgets_pending_but_keeps_committed(tmp_path: Path) -> None:
    now = [0]
    node = await Node.open(tmp_path, ephemeral=True, commit_delay_ms=1_000, clock=lambda: now[0])
    done = make_intkey_batch(SIGNER, [("set", "k", 1)])
    await node.submit([done])
    await asyncio.sleep(0.05)
    now[0] += 1_000
    assert (await node.batch_statuses([done.header_signature], wait=5))[
        done.header_signature
    ].status == "COMMITTED"
    pending = make_intkey_batch(SIGNER, [("inc", "k", 1)])
    await node.submit([pending])
    assert (await node.batch_statuses([pending.header_signature]))[
        pending.header_signature
    ].status == "PENDING"
    await node.close()
    again = await Node.open(tmp_path, ephemeral=True)
    try:
        infos = await again.batch_statuses([done.header_signature, pending.header_signature])
        assert infos[done.header_signature].status == "COMMITTED"
        assert infos[pending.header_signature].status == "UNKNOWN"
        assert value_of(await again.get_state(make_address("k")), "k") == 1
    finally:
        await again.close()


async def test_a_journal_write_failure_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerq.errors import NodeError
    from ledgerq.node import journal as journal_module

    node = await Node.open(tmp_path)
    try:

        def full_disk(file: object, data: bytes) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(journal_module, "_write_and_sync", full_disk)
        batch = make_intkey_batch(SIGNER, [("set", "f", 1)])
        with pytest.raises(NodeError, match="cannot write its journal"):
            await node.submit([batch])
        assert (await node.batch_statuses([batch.header_signature]))[
            batch.header_signature
        ].status == "UNKNOWN"
        with pytest.raises(NodeError, match="closed"):
            await node.submit([batch])
    finally:
        await node.close()


async def test_no_batch_is_journaled_after_a_failed_journal_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit waiting for a flush that fails is refused too, and nothing is written
    after the failed group: the directory opens again once the disk is fixed."""
    import threading

    from ledgerq.errors import NodeError
    from ledgerq.node import journal as journal_module

    write = journal_module._write_and_sync
    failing = threading.Event()
    failing.set()
    waiting = threading.Event()

    def full_disk_once(file: object, data: bytes) -> None:
        if not failing.is_set():
            write(file, data)  # type: ignore[arg-type]
            return
        failing.clear()
        file.write(data[: len(data) // 2])  # type: ignore[attr-defined]
        waiting.wait(5)  # until the second submit waits for this flush
        raise OSError(28, "No space left on device")

    node = await Node.open(tmp_path)
    monkeypatch.setattr(journal_module, "_write_and_sync", full_disk_once)
    first = make_intkey_batch(SIGNER, [("set", "f", 1)])
    second = make_intkey_batch(SIGNER, [("set", "g", 1)])

    async def submit_second() -> None:
        await asyncio.sleep(0.01)
        submitting = asyncio.ensure_future(node.submit([second]))
        await asyncio.sleep(0.01)
        waiting.set()
        await submitting

    try:
        results = await asyncio.gather(
            node.submit([first]), submit_second(), return_exceptions=True
        )
        assert [type(r) for r in results] == [NodeError, NodeError]
        assert "cannot write its journal" in str(results[1])
    finally:
        await node.close()
    monkeypatch.setattr(journal_module, "_write_and_sync", write)
    again = await Node.open(tmp_path)
    try:
        ids = [first.header_signature, second.header_signature]
        infos = await again.batch_statuses(ids)
        assert [infos[i].status for i in ids] == ["UNKNOWN", "UNKNOWN"]
        await again.submit([second])
        infos = await again.batch_statuses([second.header_signature], wait=10)
        assert infos[second.header_signature].status == "COMMITTED"
    finally:
        await again.close()


async def test_a_store_write_failure_is_said_in_one_line_and_to_every_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import lmdb

    from ledgerq.errors import NodeError
    from ledgerq.node.disk import LmdbStore

    def failing_write(*args: object) -> None:
        raise lmdb.Error("mdb_txn_commit: Input/output error")

    monkeypatch.setattr(LmdbStore, "write", failing_write)
    node = await Node.open(tmp_path, store_interval_s=0.01)
    try:
        await node.submit([make_intkey_batch(SIGNER, [("set", "w", 1)])])
        for _ in range(500):
            if node.committed.failure is not None:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(NodeError, match=r"cannot write its store .*Input/output error"):
            await node.submit([make_intkey_batch(SIGNER, [("set", "v", 1)])])
    finally:
        await node.close()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == [
        f"the node is closed: it cannot write its store in {tmp_path} (mdb_txn_commit: "
        "Input/output error); it stopped accepting batches: fix the disk and restart it"
    ]
    assert errors[0].exc_info is None


async def test_commits_reach_the_store_without_being_asked(tmp_path: Path) -> None:
    node = await Node.open(tmp_path, store_interval_s=0.01)
    try:
        await run(node, make_intkey_batch(SIGNER, [("set", "q", 1)]))
        for _ in range(500):  # the writer moves them within its interval
            if node.store.meta().applied == 1:
                break
            await asyncio.sleep(0.01)
        assert node.store.meta().applied == 1
        assert node.store.get_state(make_address("q")) is not None
    finally:
        await node.close()
