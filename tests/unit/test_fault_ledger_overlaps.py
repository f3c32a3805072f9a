"""The fault ledger judges what is in flight together: a batch accepted while a
conflicting batch is pending is an overlap; independent ones are not."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from ledgerq.codec import ParsedBatch, Signer, encode_batch_list, make_batch, make_transaction
from ledgerq.codec.intkey import make_address, make_intkey_batch
from ledgerq.testing.fault_ledger import FaultLedger, FaultPlan

SIGNER = Signer.generate()
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


async def post(http: aiohttp.ClientSession, url: str, *batches: ParsedBatch) -> None:
    async with http.post(f"{url}/batches", data=encode_batch_list(batches), headers=OCTET) as r:
        assert r.status == 202, await r.text()


def reader(*addresses: str) -> ParsedBatch:
    """A batch of another family that only reads ``addresses``."""
    tx = make_transaction(
        SIGNER, family_name="reader", family_version="1.0", inputs=addresses, outputs=(),
        payload=b"r",
    )  # fmt: skip
    return make_batch(SIGNER, [tx])


async def test_conflicting_batches_pending_together_are_overlaps(
    http: aiohttp.ClientSession,
) -> None:
    # Commits far in the future: everything posted stays pending.
    async with FaultLedger(FaultPlan(commit_delay_ms=60_000), judge_overlaps=True) as ledger:
        first = make_intkey_batch(SIGNER, [("set", "k", 0)])
        other = make_intkey_batch(SIGNER, [("set", "j", 0)])
        await post(http, ledger.url, first, other)
        assert ledger.overlaps == [] and ledger.peak_pending == 2
        # Reads of what is written, writes of what is read, and prefixes overlap.
        await post(http, ledger.url, reader(make_address("k")))
        await post(http, ledger.url, reader(make_address("j")[:6]))
        got = [(o.batch_id, o.pending_id) for o in ledger.overlaps]
        assert got[0] == (ledger_ids(ledger)[2], first.header_signature)
        assert {p for _, p in got[1:]} == {first.header_signature, other.header_signature}
        assert ledger.report()["overlaps"]


def ledger_ids(ledger: FaultLedger) -> list[str]:
    return list(ledger.batches)


async def test_reads_together_are_not_overlaps_and_final_batches_hold_nothing(
    http: aiohttp.ClientSession,
) -> None:
    async with FaultLedger(FaultPlan(commit_delay_ms=0), judge_overlaps=True) as ledger:
        await post(http, ledger.url, reader(make_address("k")), reader(make_address("k")))
        assert ledger.overlaps == []
        first = make_intkey_batch(SIGNER, [("set", "k", 0)])
        await post(http, ledger.url, first)
        async with http.get(
            f"{ledger.url}/batch_statuses", params={"id": first.header_signature, "wait": "5"}
        ) as r:
            assert (await r.json())["data"][0]["status"] == "COMMITTED"
        await post(http, ledger.url, make_intkey_batch(SIGNER, [("inc", "k", 1)]))
        assert ledger.overlaps == []


async def test_overlaps_are_not_judged_unless_asked(http: aiohttp.ClientSession) -> None:
    async with FaultLedger(FaultPlan(commit_delay_ms=60_000)) as ledger:
        await post(http, ledger.url, make_intkey_batch(SIGNER, [("set", "k", 0)]))
        await post(http, ledger.url, make_intkey_batch(SIGNER, [("inc", "k", 1)]))
        assert ledger.overlaps == []
