"""What must survive any crash: journal rotation, resubmissions, corruption, the
data directory lock, scabbard directories and committed transaction ids.

A "crash image" is a copy of a live node's data directory taken while it runs:
the disk as a ``kill -9`` at that moment would leave it (nothing flushed at
close). ``tests/acceptance/test_node_process.py`` kills the real process.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import cbor2
import pytest

from ledgerq.codec import ParsedBatch, Signer, make_batch, make_transaction
from ledgerq.codec.intkey import encode_payload, make_address, make_intkey_batch
from ledgerq.errors import NodeBusyError, NodeDataError
from ledgerq.node import Node, TxFingerprint
from ledgerq.node import journal as journal_module
from ledgerq.node.disk import CommitRecord
from ledgerq.node.scabbard import ScabbardServices

SIGNER = Signer.generate()


async def value(node: Node, name: str) -> int | None:
    data = await node.get_state(make_address(name))
    return None if data is None else int(cbor2.loads(data)[name])


async def statuses(node: Node, batches: list[ParsedBatch], wait: float = 10) -> list[str]:
    infos = await node.batch_statuses([b.header_signature for b in batches], wait=wait)
    return [infos[b.header_signature].status for b in batches]


def crash_image(live: Path, image: Path) -> Path:
    shutil.copytree(live, image)
    return image


def segments(directory: Path) -> list[Path]:
    return sorted(directory.rglob("journal-*.log"))


# --- (a) journal rotation under concurrent appenders ----------------------------------


async def test_rotation_while_appenders_wait_keeps_every_record_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments rotate while submitters wait between flushes: a restart replays each
    record once, under its own number."""
    write = journal_module._write_and_sync

    def slow_write(*args: object) -> None:
        time.sleep(0.003)  # a slow disk: appenders pile up between flushes
        write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(journal_module, "_write_and_sync", slow_write)
    live = tmp_path / "live"
    node = await Node.open(live, snapshot_every=1)
    total = 0
    try:
        first = make_intkey_batch(SIGNER, [("set", "r", 0)])
        await node.submit([first])
        assert await statuses(node, [first]) == ["COMMITTED"]
        batches: list[ParsedBatch] = []
        for _ in range(25):
            wave = [make_intkey_batch(SIGNER, [("inc", "r", 1)]) for _ in range(6)]
            await asyncio.gather(*(node.submit([b]) for b in wave))
            batches += wave
            await asyncio.sleep(0.002)
        total = len(batches)
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        assert await value(node, "r") == total
        await node.snapshot()  # waits for the snapshot in progress: the directory is still
        image = crash_image(live, tmp_path / "image")
    finally:
        await node.close()
    for directory in (image, live):
        again = await Node.open(directory)
        try:
            assert await value(again, "r") == total
            assert set(await statuses(again, batches, wait=0)) == {"COMMITTED"}
        finally:
            await again.close()


# --- (b) resubmission across a snapshot and a restart ---------------------------------


async def test_resubmission_outcome_is_the_same_after_a_restart(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    inc = make_intkey_batch(SIGNER, [("inc", "s", 1)])
    try:
        setter = make_intkey_batch(SIGNER, [("set", "s", 0)])
        await node.submit([setter])
        await node.submit([inc])
        assert await statuses(node, [setter, inc]) == ["COMMITTED", "COMMITTED"]
        first = node.fingerprint_of(inc.header_signature)
        assert first is not None
        await node.snapshot()
        await node.submit([inc], resubmission=first)  # ordered and executed again
        assert await statuses(node, [inc]) == ["COMMITTED"]
        second = node.fingerprint_of(inc.header_signature)
        assert second is not None and second > first
        assert await value(node, "s") == 2
    finally:
        await node.close()
    again = await Node.open(tmp_path)
    try:
        assert await value(again, "s") == 2
        assert again.fingerprint_of(inc.header_signature) == second
        # ``first`` is stale now: before and after the restart alike, it is disregarded.
        await again.submit([inc], resubmission=first)
        await again.submit([inc], resubmission=TxFingerprint(0, 0))
        assert await statuses(again, [inc]) == ["COMMITTED"]
        marker = make_intkey_batch(SIGNER, [("set", "after", 1)])
        await again.submit([marker])
        assert await statuses(again, [marker]) == ["COMMITTED"]
        assert await value(again, "s") == 2
        # The latest reference still orders it again.
        await again.submit([inc], resubmission=second)
        await again.batch_statuses([inc.header_signature], wait=10)
        assert await statuses(again, [inc]) == ["COMMITTED"]
        assert await value(again, "s") == 3
    finally:
        await again.close()


async def test_journaled_resubmission_replays_to_the_same_state(tmp_path: Path) -> None:
    live = tmp_path / "live"
    node = await Node.open(live, snapshot_every=10**6, store_interval_s=3600)
    try:
        setter = make_intkey_batch(SIGNER, [("set", "t", 0)])
        inc = make_intkey_batch(SIGNER, [("inc", "t", 1)])
        await node.submit([setter, inc])
        assert await statuses(node, [setter, inc]) == ["COMMITTED", "COMMITTED"]
        first = node.fingerprint_of(inc.header_signature)
        assert first is not None
        await node.snapshot()
        for _ in range(3):
            latest = node.fingerprint_of(inc.header_signature)
            assert latest is not None
            await node.submit([inc], resubmission=latest)
            await node.batch_statuses([inc.header_signature], wait=10)
            assert await statuses(node, [inc]) == ["COMMITTED"]
        await node.submit([inc], resubmission=first)  # stale: disregarded
        assert await value(node, "t") == 4
        image = crash_image(live, tmp_path / "image")
    finally:
        await node.close()
    again = await Node.open(image)
    try:
        assert await value(again, "t") == 4
    finally:
        await again.close()


# --- (c) corruption is refused, a torn tail is cut ---------------------------------------


async def _journal_with_records(directory: Path, names: list[str]) -> list[ParsedBatch]:
    """A crash image whose journal holds one record per name (nothing snapshotted)."""
    live = directory.with_name(directory.name + "-live")
    node = await Node.open(live, snapshot_every=10**6, store_interval_s=3600)
    batches = [make_intkey_batch(SIGNER, [("set", name, 1)]) for name in names]
    try:
        for batch in batches:
            await node.submit([batch])
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        crash_image(live, directory)
    finally:
        await node.close()
    return batches


async def test_a_flipped_byte_mid_segment_refuses_to_start(tmp_path: Path) -> None:
    image = tmp_path / "image"
    await _journal_with_records(image, ["c1", "c2", "c3", "c4"])
    [segment] = segments(image)
    data = bytearray(segment.read_bytes())
    offset = len(data) // 3
    data[offset] ^= 0x40
    segment.write_bytes(bytes(data))
    with pytest.raises(NodeDataError, match=rf"{segment.name}.*(offset|byte) \d+"):
        await Node.open(image)


async def test_a_flipped_header_byte_is_detected(tmp_path: Path) -> None:
    image = tmp_path / "image"
    await _journal_with_records(image, ["h1", "h2", "h3"])
    [segment] = segments(image)
    data = bytearray(segment.read_bytes())
    # Every byte of the file, header bytes included, is covered by a checksum:
    # flipping any of the first bytes is noticed, never parsed as something else.
    for position in range(0, 24):
        corrupt = bytearray(data)
        corrupt[position] ^= 0x01
        segment.write_bytes(bytes(corrupt))
        with pytest.raises(NodeDataError, match=segment.name):
            await Node.open(image)
    segment.write_bytes(bytes(data))
    node = await Node.open(image)
    await node.close()


async def test_a_torn_tail_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    image = tmp_path / "image"
    batches = await _journal_with_records(image, ["t1", "t2", "t3"])
    [segment] = segments(image)
    segment.write_bytes(segment.read_bytes()[:-5])  # the last write was torn
    node = await Node.open(image)
    try:
        assert await statuses(node, batches[:2], wait=0) == ["COMMITTED", "COMMITTED"]
        assert await value(node, "t1") == 1 and await value(node, "t2") == 1
    finally:
        await node.close()


# --- (d) the data directory is locked; scabbard directories never collide ---------------


async def test_a_second_node_on_one_data_directory_is_refused(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    try:
        with pytest.raises(NodeDataError, match="in use"):
            await Node.open(tmp_path)
    finally:
        await node.close()
    again = await Node.open(tmp_path)  # released at close
    await again.close()


async def test_scabbard_services_never_share_a_directory(tmp_path: Path) -> None:
    services = ScabbardServices(tmp_path)
    batch = make_intkey_batch(SIGNER, [("set", "x", 1)])
    try:
        one = await services.get("a", "b--c")
        await one.submit([batch])
        assert await statuses(one, [batch]) == ["COMMITTED"]
        two = await services.get("a--b", "c")
        assert one is not two
        assert await value(two, "x") is None
        assert await statuses(two, [batch], wait=0) == ["UNKNOWN"]
    finally:
        await services.close()
    again = ScabbardServices(tmp_path)
    try:
        assert await value(await again.get("a--b", "c"), "x") is None
        assert await value(await again.get("a", "b--c"), "x") == 1
    finally:
        await again.close()


# --- (e) a committed transaction is never committed again --------------------------------


def _inc_tx(name: str):  # type: ignore[no-untyped-def]
    address = make_address(name)
    return make_transaction(
        SIGNER,
        family_name="intkey",
        family_version="1.0",
        inputs=(address,),
        outputs=(address,),
        payload=encode_payload("inc", name, 10),
    )


def _set_tx(name: str):  # type: ignore[no-untyped-def]
    return make_intkey_batch(SIGNER, [("set", name, 1)]).transactions[0]


async def test_a_committed_transaction_in_a_new_batch_is_invalid(tmp_path: Path) -> None:
    node = await Node.open(tmp_path)
    tx = _inc_tx("e")
    try:
        setter = make_intkey_batch(SIGNER, [("set", "e", 0)])
        first = make_batch(SIGNER, [tx])
        await node.submit([setter, first])
        assert await statuses(node, [setter, first]) == ["COMMITTED", "COMMITTED"]
        # Another batch (a batch id covers its transaction ids) with the same signed tx.
        again = make_batch(SIGNER, [_set_tx("e2"), tx])
        assert again.header_signature != first.header_signature
        await node.submit([again])
        info = (await node.batch_statuses([again.header_signature], wait=10))[
            again.header_signature
        ]
        assert info.status == "INVALID"
        [invalid] = info.invalid_transactions
        assert invalid.id == tx.header_signature
        assert "already in the chain" in invalid.message
        assert await value(node, "e") == 10
    finally:
        await node.close()
    reopened = await Node.open(tmp_path)
    try:
        later = make_batch(SIGNER, [tx, _set_tx("e3")])
        await reopened.submit([later])
        assert await statuses(reopened, [later]) == ["INVALID"]
        assert await value(reopened, "e") == 10
    finally:
        await reopened.close()


async def test_two_pending_batches_sharing_a_transaction_commit_it_once() -> None:
    node = await Node.open(None)
    tx = _inc_tx("p")
    try:
        setter = make_intkey_batch(SIGNER, [("set", "p", 0)])
        one, two = make_batch(SIGNER, [tx]), make_batch(SIGNER, [_set_tx("p2"), tx])
        await node.submit([setter, one, two])
        assert await statuses(node, [setter, one, two]) == ["COMMITTED", "COMMITTED", "INVALID"]
        assert await value(node, "p") == 10
    finally:
        await node.close()


async def test_a_transaction_whose_batch_failed_may_commit_in_another() -> None:
    node = await Node.open(None)
    tx = _inc_tx("f")
    try:
        failing = make_batch(SIGNER, [tx])  # "f" is not set yet: INVALID
        retry = make_batch(SIGNER, [_set_tx("f"), tx])
        await node.submit([failing])
        assert await statuses(node, [failing]) == ["INVALID"]
        await node.submit([retry])
        assert await statuses(node, [retry]) == ["COMMITTED"]
        assert await value(node, "f") == 11
    finally:
        await node.close()


async def test_old_scabbard_directories_move_when_their_name_is_unambiguous(
    tmp_path: Path,
) -> None:
    old = tmp_path / "scabbard" / "circ--svc"
    node = await Node.open(old)
    batch = make_intkey_batch(SIGNER, [("set", "m", 7)])
    await node.submit([batch])
    assert await statuses(node, [batch]) == ["COMMITTED"]
    await node.close()
    (tmp_path / "scabbard" / "a--b--c").mkdir()
    services = ScabbardServices(tmp_path)
    try:
        moved = await services.get("circ", "svc")
        assert await value(moved, "m") == 7
        assert (tmp_path / "scabbard" / "circ" / "svc").is_dir() and not old.exists()
        with pytest.raises(NodeDataError, match="move it to"):
            await services.get("a", "b--c")
    finally:
        await services.close()


# --- memory holds what is pending and bounded caches; history is on disk -----------------


async def test_memory_holds_only_the_window_and_history_stays_answerable(tmp_path: Path) -> None:
    node = await Node.open(
        tmp_path, dedupe_window=10, event_buffer=5, block_buffer=5, replay_limit=1_000
    )
    try:
        batches = [make_intkey_batch(SIGNER, [("set", f"m{i}", i)]) for i in range(60)]
        for i in range(0, 60, 6):
            await node.submit(batches[i : i + 6])
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        await node.snapshot()
        assert len(node.machine.worker.orderings()) <= 10  # the worker's dedupe window
        assert all(not shard.state for shard in node.machine.shards)  # no copy of state
        assert node.committed.unwritten == 0 and not node._inflight and not node._pending_ids
        assert len(node._events) <= 5
        # Older than every in-memory window: answered from the store.
        oldest = batches[0]
        assert node.fingerprint_of(oldest.header_signature) is not None
        await node.submit([oldest])  # a duplicate, disregarded
        assert await statuses(node, [oldest], wait=0) == ["COMMITTED"]
        assert await value(node, "m0") == 0
        everything = await node.list_state(limit=100)
        assert [a for a, _ in everything] == sorted(make_address(f"m{i}") for i in range(60))
        page = await node.list_state(start=everything[10][0], limit=5)
        assert page == everything[10:15]
        replayed = []
        async for event in node.subscribe(after=0):
            replayed.append(event.info.id)
            if len(replayed) == 60:
                break
        assert replayed == [b.header_signature for b in batches]
        block = node.get_block(1)
        assert block is not None and node.find_block(block.id) == block
    finally:
        await node.close()


async def test_a_restart_replays_only_the_journal_after_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = tmp_path / "live"
    node = await Node.open(live, snapshot_every=10**6, store_interval_s=3600)
    batches = [make_intkey_batch(SIGNER, [("set", f"t{i}", i)]) for i in range(8)]
    try:
        await node.submit(batches[:5])
        assert set(await statuses(node, batches[:5])) == {"COMMITTED"}
        await node.snapshot()  # the store holds records 1-5
        assert node.store.meta().applied == 5
        await node.submit(batches[5:])
        assert set(await statuses(node, batches[5:])) == {"COMMITTED"}  # only in the journal
        image = crash_image(live, tmp_path / "image")
    finally:
        await node.close()
    caplog.set_level("INFO", logger="ledgerq.node")
    again = await Node.open(image)
    try:
        recovered = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
        assert recovered == ["node recovered 3 journal records after the store's last write"]
        assert set(await statuses(again, batches)) == {"COMMITTED"}
        assert [await value(again, f"t{i}") for i in range(8)] == list(range(8))
    finally:
        await again.close()


async def test_a_resume_from_long_ago_replays_at_most_the_limit(tmp_path: Path) -> None:
    node = await Node.open(tmp_path, event_buffer=3, block_buffer=3, replay_limit=4)
    try:
        batches = [make_intkey_batch(SIGNER, [("set", f"r{i}", i)]) for i in range(10)]
        await node.submit(batches)
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        await node.snapshot()
        events = node.subscribe(after=0)  # Last-Event-ID: 0
        seqs = [(await asyncio.wait_for(events.__anext__(), 5)).seq for _ in range(4)]
        assert seqs == [7, 8, 9, 10]
        blocks = node.follow_blocks(after=0)
        nums = [(await asyncio.wait_for(blocks.__anext__(), 5)).num for _ in range(4)]
        assert nums == [7, 8, 9, 10]
        await events.aclose()
        await blocks.aclose()
    finally:
        await node.close()


async def test_a_large_store_write_is_cut_into_transactions_at_commit_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LMDB keeps as many page buffers as its largest write transaction dirtied:
    # a write of many commits goes to the store in transactions of a bounded size,
    # each with the journal point it covers, so a crash between two leaves a
    # consistent store and the journal replays the rest.
    live = tmp_path / "live"
    node = await Node.open(live, snapshot_every=10**6, store_interval_s=3600)
    node.committed._write_keys = 24  # four commits of 6 keys
    written: list[tuple[int, int]] = []
    write = node.store.write

    def spy(records: list[object], applied: int, batch_high: int, nodes: Any = None) -> None:
        written.append((len(records), applied))
        write(records, applied, batch_high, nodes)  # type: ignore[arg-type]
        if len(written) == 2:
            shutil.copytree(live, tmp_path / "image")  # a kill -9 between two transactions

    monkeypatch.setattr(node.store, "write", spy)
    batches = [make_intkey_batch(SIGNER, [("set", "g", 0)])]
    batches += [make_intkey_batch(SIGNER, [("inc", "g", 1)]) for _ in range(11)]
    try:
        for i in range(0, 12, 2):  # commits reach the view two by two
            await node.submit(batches[i : i + 2])
            assert set(await statuses(node, batches[i : i + 2])) == {"COMMITTED"}
        assert written == []
        await node.snapshot()  # one write of 12 commits
        assert written == [(4, 4), (4, 8), (4, 12)]
        assert node.store.meta().applied == 12
    finally:
        await node.close()
    again = await Node.open(tmp_path / "image")
    try:
        assert set(await statuses(again, batches)) == {"COMMITTED"}
        assert await value(again, "g") == 11  # records 9-12 replayed once, 1-8 not again
    finally:
        await again.close()


async def test_closing_while_the_store_is_being_written_lets_the_write_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await Node.open(tmp_path, snapshot_every=10**6, store_interval_s=3600)
    entered, release = threading.Event(), threading.Event()
    write = node.store.write

    def slow(records: list[object], applied: int, batch_high: int, nodes: Any = None) -> None:
        entered.set()
        release.wait(10)
        write(records, applied, batch_high, nodes)  # type: ignore[arg-type]

    monkeypatch.setattr(node.store, "write", slow)
    batches = [make_intkey_batch(SIGNER, [("set", f"w{i}", i)]) for i in range(5)]
    await node.submit(batches)
    assert set(await statuses(node, batches)) == {"COMMITTED"}
    node.committed._signal.set()  # the writer starts a write, in its thread
    assert await asyncio.to_thread(entered.wait, 10)
    closing = asyncio.create_task(node.close())  # cancels the writer mid-write
    for _ in range(10_000):  # close stops the driver, then cancels the writer
        if node._writer is None:
            break
        await asyncio.sleep(0.001)
    for _ in range(10):  # let the cancellation reach the writer, and close go on
        await asyncio.sleep(0)
    release.set()
    await asyncio.wait_for(closing, 30)
    again = await Node.open(tmp_path, store_interval_s=3600)
    try:
        assert again.store.meta().applied == 5  # the write finished before the store closed
        assert set(await statuses(again, batches)) == {"COMMITTED"}
    finally:
        await again.close()


async def test_a_large_commit_slice_reaches_the_store_in_bounded_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerq.node import node as node_module

    monkeypatch.setattr(node_module, "COMMIT_PART", 3)
    node = await Node.open(tmp_path, snapshot_every=10**6, store_interval_s=3600)
    node.committed._write_keys = 18
    written: list[tuple[int, int]] = []
    write = node.store.write

    def spy(records: list[object], applied: int, batch_high: int, nodes: Any = None) -> None:
        written.append((len(records), applied))
        write(records, applied, batch_high, nodes)  # type: ignore[arg-type]

    monkeypatch.setattr(node.store, "write", spy)
    batches = [make_intkey_batch(SIGNER, [("set", f"p{i}", i)]) for i in range(10)]
    try:
        await node.submit(batches)  # one commit slice of 10
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        await node.snapshot()
        assert written == [(3, 3), (3, 6), (3, 9), (1, 10)]
    finally:
        await node.close()


async def test_a_writer_behind_merges_parts_into_transactions_bounded_in_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parts waiting for the writer go to the store together, but no transaction
    # takes more than write_commits commits, however few keys each has.
    from ledgerq.node import node as node_module

    monkeypatch.setattr(node_module, "COMMIT_PART", 2)
    node = await Node.open(tmp_path, snapshot_every=10**6, store_interval_s=3600)
    node.committed._write_commits = 4
    written: list[int] = []
    write = node.store.write

    def spy(records: list[CommitRecord], applied: int, batch_high: int, nodes: Any = None) -> None:
        written.append(len(records))
        write(records, applied, batch_high, nodes)

    monkeypatch.setattr(node.store, "write", spy)
    batches = [make_intkey_batch(SIGNER, [("set", f"m{i}", i)]) for i in range(10)]
    try:
        await node.submit(batches)  # parts of 2 commits, 6 keys each: all waiting
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        await node.snapshot()
        assert written == [4, 4, 2]
        assert node.store.meta().applied == 10
    finally:
        await node.close()


async def test_store_transactions_are_bounded_in_keys_not_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LMDB keeps every page buffer a write transaction dirtied, about one per key:
    # batches of ten transactions (42 keys each) must not make transactions ten
    # times larger than single-transaction batches do.
    from ledgerq.node import node as node_module
    from ledgerq.node.committed import store_keys

    monkeypatch.setattr(node_module, "STORE_TXN_KEYS", 90)
    node = await Node.open(tmp_path, snapshot_every=10**6, store_interval_s=3600)
    node.committed._write_keys = 90
    written: list[int] = []
    write = node.store.write

    def spy(records: list[CommitRecord], applied: int, batch_high: int, nodes: Any = None) -> None:
        written.append(sum(store_keys(r) for r in records))
        write(records, applied, batch_high, nodes)

    monkeypatch.setattr(node.store, "write", spy)
    batches = [
        make_intkey_batch(SIGNER, [("set", f"k{i}-{j}", j) for j in range(10)]) for i in range(10)
    ]
    try:
        await node.submit(batches)  # one commit slice of 10 commits, 420 keys
        assert set(await statuses(node, batches)) == {"COMMITTED"}
        await node.snapshot()
        assert written == [84] * 5  # two commits per store transaction
        assert node.store.meta().applied == 10
    finally:
        await node.close()


async def test_submit_answers_busy_while_the_store_is_too_far_behind(tmp_path: Path) -> None:
    node = await Node.open(tmp_path, store_interval_s=3600, max_unwritten=5)
    try:
        first = [make_intkey_batch(SIGNER, [("set", f"u{i}", i)]) for i in range(6)]
        await node.submit(first)
        await node.batch_statuses([b.header_signature for b in first], wait=10)
        assert node.committed.unwritten == 6  # committed, not yet in the store
        with pytest.raises(NodeBusyError, match="commits behind"):
            await node.submit([make_intkey_batch(SIGNER, [("set", "late", 1)])])
        await node.snapshot()  # the store catches up: accepted again
        await node.submit([make_intkey_batch(SIGNER, [("set", "late", 1)])])
    finally:
        await node.close()
