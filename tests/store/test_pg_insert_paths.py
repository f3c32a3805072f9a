"""PostgreSQL ``add_batches``: its two ways of writing rows say the same.

Lists up to ``LITERAL_MAX_BATCHES`` batches go as array literals bound on the
client (sent with the ``COMMIT``), larger ones by binary ``COPY``. Either
way every value reads back as sent, whatever characters it holds, and every
new batch's blocker (found set-based by ``blockers_of``) is what
``ledgerq_blocker``, the rule the release trigger applies, says of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import psycopg
import pytest

from ledgerq.model import TrackingBatch, TrackingTransaction
from ledgerq.store import open_store
from ledgerq.store import postgres as pg

from .conftest import hex_id

pytestmark = pytest.mark.pg

ODD = ["a,b", "NULL", "null", "x y", 'q"uote', "back\\slash", "{brace}", "é", "''"]


@pytest.fixture(params=["literal", "copy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "copy":
        monkeypatch.setattr(pg, "LITERAL_MAX_BATCHES", 0)
    return str(request.param)


def odd_batch(service: str, n: int) -> TrackingBatch:
    bid = hex_id("b")
    odd = ODD[n % len(ODD)]
    return TrackingBatch(
        service_id=service,
        batch_header=bid,
        data_change_id=None if n % 3 == 0 else f"dc {odd} {n}",
        signer_public_key="02" + "ab" * 32,
        trace=n % 2 == 1,
        serialized_batch=bytes(range(256)) + odd.encode(),
        transactions=tuple(
            TrackingTransaction(
                family_name=f"fam {odd}",
                family_version=odd[:16] or "v",
                transaction_header=hex_id("t"),
                payload=b"\x00\\\"'{}," + bytes([k]),
                signer_public_key="03" + "cd" * 32,
                service_id=service,
                inputs=None if k == 1 else (odd, "1cf126" + "ab" * 32, ""),
                outputs=() if k == 2 else (f"{odd}{k}", "NULL"),
                dependencies=(hex_id("t"),) if k == 0 else (),
            )
            for k in range(3)
        ),
    )


async def test_every_value_reads_back_as_sent(path: str, pg_url: str) -> None:
    store = await open_store(pg_url, lock_entries=True)
    try:
        sent = [odd_batch(service, n) for n, service in enumerate(["s,1", 's"2', "s 3"] * 4)]
        stored = await store.add_batches(sent)
        assert [b.seq for b in stored] == sorted(b.seq for b in stored)
        for want, got_stored in zip(sent, stored, strict=True):
            got = await store.get_batch(want.batch_header, want.service_id)
            assert got is not None
            assert got.seq == got_stored.seq
            assert got.data_change_id == want.data_change_id
            assert got.trace == want.trace
            assert got.serialized_batch == want.serialized_batch
            assert got.transactions == want.transactions
    finally:
        await store.close()


def population(rng: random.Random) -> list[list[TrackingBatch]]:
    """Calls of ``add_batches`` over three services: reads and writes from a
    few overlapping entries (prefixes of each other among them), unknown
    access, dependencies on transactions of earlier calls and of the same
    call."""
    entries = ["1cf126", "1cf126ab", "1cf126" + "ab" * 32, "1cf126" + "cd" * 32, "ff", ""]
    sent: dict[str, list[str]] = {"s1": [], "s2": [], "s3": []}
    calls = []
    for _ in range(12):
        call = []
        for _ in range(rng.randint(1, 6)):
            service = rng.choice(list(sent))
            tid = hex_id("t")
            deps = rng.sample(sent[service], min(len(sent[service]), rng.randint(0, 2)))
            call.append(
                TrackingBatch(
                    service_id=service,
                    batch_header=hex_id("b"),
                    data_change_id=None,
                    signer_public_key="02" + "ab" * 32,
                    trace=False,
                    serialized_batch=b"batch",
                    transactions=(
                        TrackingTransaction(
                            family_name="intkey",
                            family_version="1.0",
                            transaction_header=tid,
                            payload=b"p",
                            signer_public_key="03" + "cd" * 32,
                            service_id=service,
                            inputs=None
                            if rng.random() < 0.05
                            else tuple(rng.sample(entries[:-1], rng.randint(0, 2))),
                            outputs=tuple(rng.sample(entries[:-1], rng.randint(0, 2))),
                            dependencies=tuple(deps),
                        ),
                    ),
                )
            )
            sent[service].append(tid)
        calls.append(call)
    return calls


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_blockers_are_what_ledgerq_blocker_says(
    path: str, make_pg_database: Callable[[], str], seed: int
) -> None:
    url = make_pg_database()
    store = await open_store(url, lock_entries=True)
    try:
        for call in population(random.Random(seed)):
            await store.add_batches(call)
    finally:
        await store.close()
    with psycopg.connect(url) as conn:
        # Nothing became final since: the rule, asked now, sees what the
        # insert saw, and the batches of the same call besides (the
        # dependencies within a call, which the insert adds itself).
        rows = conn.execute(
            "SELECT seq, blocked_by, ledgerq_blocker(service_id, seq) FROM batches ORDER BY seq"
        ).fetchall()
    assert rows
    assert [(seq, blocked) for seq, blocked, _ in rows] == [(seq, rule) for seq, _, rule in rows]
    assert any(blocked is not None for _, blocked, _ in rows)
